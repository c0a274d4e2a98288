"""The trainer with a SentencePiece vocabulary trained on the fly: train (the loss
falls), then decode (the model's greedy continuations, in the vocabulary's pieces)."""
import math
import os

import gin

import trainer_helpers
from decode_checks import greedy_lm_decode
from models.transformer.trainer import decode_io
from models.transformer.trainer import gin_setup
from models.transformer import utils
from models.transformer.vocabulary import SentencePieceVocabulary
from trainer_helpers import run_with


def test_lm_trains_and_decodes_with_an_on_the_fly_sentencepiece_vocabulary(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  prefix = str(tmp_path / "spm")
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus, train_steps=4,
                                            save_every=4) + [
      "utils.run.vocabulary = @vocabulary.trained_sentencepiece_vocabulary()",
      "trained_sentencepiece_vocabulary.vocab_size = 48",
      "trained_sentencepiece_vocabulary.text_glob = %r" % str(corpus),
      "trained_sentencepiece_vocabulary.model_prefix = %r" % prefix]
  history = run_with(params)
  assert os.path.exists(prefix + ".model")
  assert [s for s, _ in history] == [2, 4] and math.isfinite(history[-1][1])
  assert history[-1][1] < history[0][1], history  # a repetitive corpus: it learns
  vocab = SentencePieceVocabulary(prefix + ".model")
  lines = run_with(params + ["utils.run.decode_output_file = %r"
                             % str(tmp_path / "out.txt")], mode="decode")
  assert (tmp_path / "out.txt").read_text().split("\n")[:-1] == lines

  # The lines are the greedy continuations of the default prompts, computed here from
  # the checkpoint's logits and decoded with the same pieces.
  prompts = [vocab.encode(p)[:15] for p in decode_io.DEFAULT_PROMPTS]
  gin.clear_config()
  try:
    gin_setup.parse_gin([], params)
    estimator = utils.get_estimator(
        "lm", vocab, "", "", str(tmp_path / "m"), 8, 16, True, 0.01, 2, 4, None, None,
        None, None, False, None, 2, None)
    expected = greedy_lm_decode(estimator, prompts, 16, vocab.vocab_size)
  finally:
    gin.clear_config()
  assert lines == [vocab.decode(row).replace("\r", " ").replace("\n", " ")
                   for row in expected]
  assert any(lines)
