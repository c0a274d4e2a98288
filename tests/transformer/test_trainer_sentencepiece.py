"""The trainer with a SentencePiece vocabulary trained on the fly: train, then decode."""
import math
import os

import trainer_helpers
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
  assert history and history[-1][0] == 4 and math.isfinite(history[-1][1])
  lines = run_with(params + ["utils.run.decode_output_file = %r"
                             % str(tmp_path / "out.txt")], mode="decode")
  assert len(lines) == 4 and all(isinstance(line, str) for line in lines)
  assert (tmp_path / "out.txt").read_text().count("\n") == 4
