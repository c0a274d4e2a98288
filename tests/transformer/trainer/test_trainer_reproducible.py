"""utils.run.seed: two trainings of one config give identical losses and weights.

The layers' initializers draw from TF's global random state (tf.random_normal_initializer
and friends without op seeds), so without the seed two runs start from different weights.
"""
import numpy as np
import tensorflow as tf

import trainer_helpers
from trainer_helpers import run_with
from models.transformer.trainer import run_setup


def _train(tmp_path, name, corpus, extra=()):
  model_dir = tmp_path / name
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=4,
                                            save_every=4, log_every=1)
  history = run_with(params + list(extra))
  reader = tf.train.load_checkpoint(str(model_dir))
  weights = {name: reader.get_tensor(name)
             for name in reader.get_variable_to_shape_map() if name != "global_step"}
  return history, weights


def test_same_seed_gives_identical_losses_and_weights(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  first, first_weights = _train(tmp_path, "a", corpus, ["utils.run.seed = 7"])
  second, second_weights = _train(tmp_path, "b", corpus, ["utils.run.seed = 7"])
  assert [s for s, _ in first] == [1, 2, 3, 4]
  assert first == second  # exactly equal floats
  assert sorted(first_weights) == sorted(second_weights)
  for name, value in first_weights.items():
    np.testing.assert_array_equal(value, second_weights[name], err_msg=name)
  other, _ = _train(tmp_path, "c", corpus, ["utils.run.seed = 8"])
  assert [l for _, l in other] != [l for _, l in first]


def test_seed_makes_input_pipeline_shuffles_repeatable():
  def shuffled():
    return list(tf.data.Dataset.range(50).shuffle(50).as_numpy_iterator())
  run_setup.seed_everything(3)
  first = shuffled()
  run_setup.seed_everything(3)
  assert shuffled() == first
  run_setup.seed_everything(4)
  assert shuffled() != first
  assert sorted(first) == list(range(50))
