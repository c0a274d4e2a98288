"""A placement mesh over two worker processes (4 CPUs each), driven by one client."""
import numpy as np
import pytest

import cluster_helpers
import mesh_tf as mtf
from models.mlp.model import MlpModel, synthetic_digits


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
  """Two local workers with 4 virtual CPUs each, shared by this module's tests."""
  with cluster_helpers.local_workers(tmp_path_factory.mktemp("workers")) as (addrs, _):
    yield ",".join(addrs)


def test_mlp_across_processes_matches_one_device_and_restores_anywhere(workers, tmp_path):
  run = cluster_helpers.run_script(["tests/cluster/mlp_client.py", workers, str(tmp_path)])
  assert run.returncode == 0, run.stderr[-3000:]
  result = cluster_helpers.last_json_line(run.stdout)
  assert {d.split("/task:")[1][0] for d in result["devices"]} == {"0", "1"}
  np.testing.assert_allclose(result["losses"], result["single_losses"], rtol=1e-5)
  assert result["losses"][-1] < result["losses"][0]
  images, labels = synthetic_digits(32, seed=1)
  for impl in (mtf.PlacementMeshImpl("", "", [""]),
               mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
                                     ["/cpu:%d" % i for i in range(8)])):
    model = MlpModel(batch_size=32, hidden_size=32)
    eval_step = model.make_eval_step(impl)
    mtf.restore_checkpoint(result["checkpoint"], impl)
    np.testing.assert_allclose(float(eval_step(images, labels)), result["eval_loss"],
                               rtol=1e-5)
