"""How many batches eval mode evaluates: perplexity_eval_steps when the user set it,
else eval_steps, else defaults.gin's perplexity_eval_steps."""
import pytest

import trainer_helpers
from models.transformer import utils


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  directory = tmp_path_factory.mktemp("eval_steps")
  corpus = trainer_helpers.write_corpus(directory)
  params = trainer_helpers.tiny_lm_bindings(directory / "m", corpus, train_steps=2,
                                            save_every=2)
  trainer_helpers.run_with(params)
  # Without tiny_lm_bindings' own perplexity_eval_steps: defaults.gin's applies.
  return [p for p in params if not p.startswith("utils.run.perplexity_eval_steps")] + [
      "utils.run.dataset_split = 'validation'"]


def _batches(params):
  return trainer_helpers.run_with(params, mode="eval")["batches"]


def test_bound_perplexity_eval_steps_wins_over_eval_steps(trained):
  assert _batches(trained + ["utils.run.perplexity_eval_steps = 3",
                             "utils.run.eval_steps = 1"]) == 3


def test_eval_steps_applies_when_perplexity_eval_steps_is_not_set(trained):
  assert _batches(trained + ["utils.run.eval_steps = 1"]) == 1


def test_default_perplexity_eval_steps_without_either(trained):
  default = utils._default_binding("utils.run", "perplexity_eval_steps", 100)
  assert default not in (1, 3)
  assert _batches(trained) == default
