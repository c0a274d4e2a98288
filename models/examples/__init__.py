"""Examples in the original library's style (model function building its own mesh,
MeshImpl and Lowering), with Estimator scaffolding replaced by a tf.function loop."""
