"""The trainer of the Transformer models: `utils.run`'s modes (train in one process or
in multi-client SPMD, eval, decode, export), the one step loop, checkpoints and run
records, progress and metrics, gin set-up, the estimator-style entry points and the
cluster set-up. The model library (layers, stacks, decoding, data) is the parent
package; `models.transformer.utils` and `models.transformer.main` keep the original's
entry points."""
