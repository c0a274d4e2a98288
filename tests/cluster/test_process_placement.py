"""ProcessPlacementMeshImpl, a process's devices as one placement program of a
multi-process mesh, in one process: which meshes it runs, its errors, its input shares,
and the collectives its traced train step emits (none run here; the two-process runs
are in test_spmd_cluster.py and test_spmd_trainer.py)."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import cluster
from mesh_tf.backends.process_placement import ProcessPlacementMeshImpl, process_split
from mesh_tf.cluster import input_share, multi_client
from tests import mtf_testing
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm

MESH = "batch:2;model:4"
LAYOUT = "batch:batch;d_ff:model;heads:model;vocab:model"


def _process(task, mesh=MESH):
  k = 4
  return ProcessPlacementMeshImpl(mesh, LAYOUT, range(task * k, (task + 1) * k),
                                  ["/cpu:%d" % i for i in range(k)])


@pytest.mark.parametrize("mesh,pnums,split", [
    (MESH, [0, 1, 2, 3], (1, 4)),  # model whole
    (MESH, [4, 5, 6, 7], (1, 4)),
    ("a:2;b:2;c:2", [4, 5, 6, 7], (1, 2)),
    (MESH, [5], (2, 1)),  # one device: nothing local
    (MESH, list(range(8)), (0, 2)),  # one process: everything local
    (MESH, [2, 3], (1, 2)),  # 4 processes: the model groups are cut in two
    ("batch:8", [4, 5, 6, 7], (0, 4)),  # half of batch
    ("a:4;b:3", list(range(6)), (0, 2)),
    (MESH, [2, 3, 4, 5], None),  # not a block
    ("a:3;b:4", list(range(6)), None),  # 6 is not a whole number of b's rows
    ("a:2;b:3", [0, 1], None),  # 2 does not divide b
])
def test_a_process_holds_a_block_of_the_mesh(mesh, pnums, split):
  assert process_split(mesh, pnums) == split


def test_replica_set_runs_a_process_as_one_program_where_the_mesh_allows():
  runs = multi_client._runs_per_process  # pylint: disable=protected-access
  shape = mtf.convert_to_shape(MESH)
  assert runs("auto", shape, [0, 1, 2, 3], "CPU", None)
  assert runs("auto", shape, [0, 1], "CPU", None)  # 4 processes of 2
  assert not runs("auto", shape, [0, 1, 2, 3], "GPU", None)  # untested on GPUs
  assert not runs("auto", shape, [3], "CPU", None)  # one device: a replica is as good
  assert not runs("per_device", shape, [0, 1, 2, 3], "CPU", None)
  assert runs("per_process", shape, [0, 1, 2, 3], "GPU", None)
  with pytest.raises(cluster.ClusterError, match="program 'per_process' needs each "
                     "process to hold a block of mesh batch:2;model:4 "
                     r"\(processors \[2, 3, 4, 5\] are not one\); use 'per_device'"):
    runs("per_process", shape, [2, 3, 4, 5], "CPU", None)
  with pytest.raises(cluster.ClusterError, match="program 'each': choose one of auto, "
                     "per_process, per_device"):
    multi_client.ReplicaSet(MESH, LAYOUT, "a:1,b:2", 0, program="each")
  from models.transformer.trainer import cluster_setup  # pylint: disable=g-import-not-at-top
  assert cluster_setup.SPMD_PROGRAMS == multi_client.PROGRAMS  # the gin check's list


def test_errors_name_the_processors_and_the_devices():
  with pytest.raises(mtf.LayoutError, match=r"processors \[2, 3, 4, 5\] of mesh "
                     "batch:2;model:4 are not a block of it"):
    ProcessPlacementMeshImpl(MESH, LAYOUT, [2, 3, 4, 5], ["/cpu:%d" % i for i in range(4)])
  with pytest.raises(mtf.LayoutError, match=r"processors \[0, 1, 2, 3\] of mesh "
                     "batch:2;model:4 need one device each, but 2 devices were given"):
    ProcessPlacementMeshImpl(MESH, LAYOUT, range(4), ["/cpu:0", "/cpu:1"])


def test_each_process_imports_its_share_as_the_full_batch_would():
  batch, shape, holder = mtf_testing.batch_to_import()
  for task in range(2):
    impl = _process(task)
    begin, end = input_share.batch_rows(impl, shape)
    assert (begin, end) == (4 * task, 4 * task + 4)
    share = impl.import_tf_tensor(holder, batch[begin:end]).tensor_list
    full = impl.import_tf_tensor(holder, batch).tensor_list
    assert len(share) == len(full) == 4
    for a, b in zip(share, full):
      np.testing.assert_array_equal(a.numpy(), b.numpy())
      np.testing.assert_array_equal(a.numpy(), batch[begin:end].numpy())
  with pytest.raises(mtf.LayoutError, match=r"input inputs of shape \[3, 8\]"):
    _process(0).import_tf_tensor(holder, batch[:3])


def test_processor_numbers_and_coordinates_are_the_meshs():
  impl = _process(1)
  assert [int(t) for t in impl.laid_out_pnum().tensor_list] == [4, 5, 6, 7]
  assert [int(t) for t in impl.laid_out_pcoord(0).tensor_list] == [1, 1, 1, 1]
  assert [int(t) for t in impl.laid_out_pcoord(1).tensor_list] == [0, 1, 2, 3]
  shape = mtf.Shape([mtf.Dimension("batch", 8), mtf.Dimension("d_ff", 8)])
  begins = impl.laid_out_slice_begin(shape).tensor_list
  assert [t.numpy().tolist() for t in begins] == [[4, 0], [4, 2], [4, 4], [4, 6]]


def _traced_step(impl):
  """(graph, Lowering) of a 1-layer tiny LM's train step traced on impl, fed its
  process's rows (the tiny LM's batch is 8)."""
  model = lm.TinyLmModel(lm_config.TinyLmConfig(num_layers=1, heads=8))
  batch = lm_config.synthetic_batch(model.config)
  rows = input_share.batch_rows(impl, "batch:%d;length:%d" % (model.config.batch,
                                                             model.config.length))
  feeds = (batch[rows[0]:rows[1], :-1], batch[rows[0]:rows[1], 1:])
  return mtf_testing.traced_train_step(model, impl, feeds)


@pytest.mark.parametrize("mesh,layout,pnums,collectives", [
    (MESH, LAYOUT, range(4, 8), 1),
    ("batch:8", "batch:batch", range(4, 8), 1),  # half of the batch axis per process
    (MESH, LAYOUT, [6, 7], None),  # 4 processes: model-axis sums cross too
])
def test_only_the_cross_parts_leave_the_process(mesh, layout, pnums, collectives):
  """Collectives over the process's own coordinates are in-memory sums; every gradient
  SUM over the processes (einsums' and reductions' owed sums) and the loss's go in ONE
  CollectiveReduceV2 for all local processors. The accounting is the per-device
  replicas'."""
  impl = ProcessPlacementMeshImpl(mesh, layout, pnums,
                                  ["/cpu:%d" % i for i in range(len(pnums))])
  graph, lowering = _traced_step(impl)
  ops = collections.Counter(o.type for o in graph.get_operations())
  if collectives is not None:
    assert ops["CollectiveReduceV2"] == collectives
  else:  # the forward's model-axis sums leave the process too
    assert ops["CollectiveReduceV2"] > 1
  assert not any("Collective" in t for t in ops if t != "CollectiveReduceV2")
  replica = multi_client.MultiClientMeshImpl(mesh, layout, pnums[-1], "/cpu:0", pnums)
  _, replica_lowering = _traced_step(replica)
  key = lambda r: (r.kind, r.mesh_axes, r.group_size, r.slice_bytes)
  assert (sorted(map(key, lowering.comm_records)) ==
          sorted(map(key, replica_lowering.comm_records)))
  assert any(r.mesh_axes == (0,) for r in lowering.comm_records)
