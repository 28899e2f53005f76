"""Several Ray nodes: Ray's own `ray.cluster_utils.Cluster` runs a head and a worker node on this machine, all
on 127.0.0.1, and the workers are spread over both by their placement group. With AHA_TEST_RAY_ADDRESS set
(a real cluster with at least two nodes and 4 CPUs), the same test runs there instead."""

import os
import time

import pytest

from aha.train.grpo import GRPOTrainer
import scripted
import test_dist
from scripted import ScriptedEngine
from test_dist import PROMPTS, _gone, _pids, _ray_children, args, digit_share

ray = pytest.importorskip("ray")
for module in (test_dist, scripted):  # a real cluster's nodes have no copy of the tests
    ray.cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="module")
def cluster_address():
    if os.environ.get("AHA_TEST_RAY_ADDRESS"):
        yield os.environ["AHA_TEST_RAY_ADDRESS"]
        return
    from ray.cluster_utils import Cluster

    from aha.dist.cluster import loopback_only
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1",
                                                                "include_dashboard": False})
        cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
    yield cluster.address
    ray.shutdown()
    cluster.shutdown()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _ray_children():
        time.sleep(0.2)
    assert not _ray_children(), _ray_children()


def test_workers_spread_over_two_nodes_and_train(tiny_dir, tmp_path, cluster_address):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=ScriptedEngine,
                    args=args(tmp_path / "multi", ray_address=cluster_address, num_rollout_workers=2,
                              num_learners=2, placement_strategy="SPREAD", max_steps=2))
    pids = _pids(t.pipeline)
    where = ray.get([w.node.remote() for w in t.pipeline.rollout + t.pipeline.learners], timeout=60)
    assert len(set(where)) == 2, where  # both nodes host workers
    if not os.environ.get("AHA_TEST_RAY_ADDRESS"):
        assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    metrics = t.train()
    assert t.step_count == 2 and metrics["dist/groups_trained"] == 2
    if not os.environ.get("AHA_TEST_RAY_ADDRESS"):
        assert _gone(pids)


def test_a_ray_address_where_nothing_listens_is_an_error_not_a_hang():
    import socket

    from aha.dist.cluster import connect
    with socket.socket() as s:  # a free loopback port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"ray_address='127.0.0.1:{port}': no Ray cluster answers there"):
        connect(f"127.0.0.1:{port}", 1, timeout_s=5)
    assert time.monotonic() - t0 < 5
