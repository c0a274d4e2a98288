"""The trainer of the Transformer models: `utils.run`'s modes (train, eval, decode,
export), checkpoints, metrics, gin set-up, the estimator-style entry points and the
cluster set-up. The model library is the parent package."""
