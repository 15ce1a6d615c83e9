"""Training over several processes or machines: ``launch`` starts a ps-lite job (scheduler, servers,
workers); the training side of ``dist_sync`` is lib/train/distributed.py."""
