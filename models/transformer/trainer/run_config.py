"""`RunConfig`: one value holding what utils.run resolved for a run, built once there and
handed to the mode that runs (train in one process or in multi-client SPMD, eval)."""
import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What utils.run resolved: the model, data, sizes and schedule of a run. model_fn
  makes a fresh model per mtf graph; total_run_steps is the schedules' total (default
  train_steps); operative_config_extra is appended to operative_config.gin."""
  model_fn: typing.Callable
  model_dir: str
  vocabulary: object
  batch_size: int
  sequence_length: object
  variable_dtype: object
  dataset_split: str = "train"
  train_dataset_fn: typing.Optional[typing.Callable] = None
  eval_dataset_fn: typing.Optional[typing.Callable] = None
  train_steps: int = 0
  total_run_steps: typing.Optional[int] = None
  optimizer: object = None
  learning_rate_schedule: object = None
  save_checkpoints_steps: int = 1000
  keep_checkpoint_max: typing.Optional[int] = 5
  iterations_per_loop: int = 100
  eval_steps: int = 0
  init_checkpoint: typing.Optional[str] = None
  num_microbatches: int = 1
  eval_decode_batches: int = 0
  skip_nonfinite_updates: bool = False
  operative_config_extra: str = ""

  @property
  def loop(self):
    """The step loop's part of it (step_loop.LoopConfig)."""
    from models.transformer.trainer import step_loop  # pylint: disable=g-import-not-at-top
    return step_loop.LoopConfig(self.train_steps, self.save_checkpoints_steps,
                                self.iterations_per_loop, self.skip_nonfinite_updates)
