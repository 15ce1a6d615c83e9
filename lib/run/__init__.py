"""The run record, below training and inference alike: checkpoint files (parameters, optimizer states,
progress), the self-describing run folder (config.yaml, model metadata) and the run lock."""
