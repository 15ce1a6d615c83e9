"""SNIPER chip generation: positive chips by greedy cover (`generate`) and per-image mining (`mining`)."""
from chip_generator.cover import generate

__all__ = ["generate"]
