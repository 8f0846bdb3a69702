"""The Ray cluster half of the agent without a cluster (issue 56): what is merged into a job's
``runtime_env`` (``raycluster.merged``), the collector's bounds and hand-over
(``raysink.Collector``), the names the driver accepts from it, and the lines naming a
process whose figures never came home (``merge.unreported``). The real cluster:
test_profile_ray_cluster.py."""

from __future__ import annotations

import importlib
import pickle

import pytest

import profile_helpers as helpers
from stallbench.profile import merge
from stallbench.profile.agent import wire


@pytest.fixture(scope="module")
def agent():
    name = "_agent_raycluster_test"
    helpers.load_agent(name)
    return (importlib.import_module(f"{name}.raycluster"),
            importlib.import_module(f"{name}.raysink"))


def _settings() -> wire.Settings:
    return wire.Settings(overrides={"ray": {"prefetch_batches": 4}}, max_batches=9,
                         collector="stallbench-collector-1")


def test_the_agent_is_merged_into_the_jobs_runtime_env_never_replacing_it(agent) -> None:
    rc, _ = agent
    job = {"py_modules": ["/job/mod"], "env_vars": {"A": "1"}, "pip": ["x"]}
    before = repr(job)
    env = rc.merged(job, "/scratch/_stallbench_profile_agent", _settings())
    assert repr(job) == before                            # the job's own object untouched
    assert env["py_modules"] == ["/job/mod", "/scratch/_stallbench_profile_agent"]
    assert env["pip"] == ["x"] and env["env_vars"]["A"] == "1"
    sent = wire.Settings.from_env(env["env_vars"])
    assert sent == _settings() and not sent.run_dir and sent.active   # no path, no secret
    assert env["worker_process_setup_hook"] == rc.HOOK
    # nothing at all of the job's: the agent's alone
    bare = rc.merged(None, "/m", _settings())
    assert set(bare) == {"py_modules", "env_vars", "worker_process_setup_hook"}


def test_the_jobs_own_setup_hook_is_chained_after_the_agents(agent) -> None:
    rc, sink = agent
    env = rc.merged({"worker_process_setup_hook": "pkg.mod.setup"}, "/m", _settings())
    assert env["worker_process_setup_hook"] == rc.HOOK
    assert wire.Settings.from_env(env["env_vars"]).hook == "pkg.mod.setup"
    ran = []
    env = rc.merged({"worker_process_setup_hook": lambda: ran.append("job")}, "/m",
                    _settings())
    hook = env["worker_process_setup_hook"]
    assert callable(hook) and hook.__name__ == "<lambda>" and not wire.Settings.from_env(
        env["env_vars"]).hook
    # the standard pickle (Ray Client pickles a job's config with it) takes it as it takes
    # the job's own hook: a module-level function by reference
    assert pickle.loads(pickle.dumps(sink.Chained(print))).job_hook is print
    # a hook Ray already exported into the env cannot be chained: refused, said, job as is
    with pytest.raises(ValueError):
        rc.merged({"env_vars": {rc.RESERVED: "x"}}, "/m", _settings())


def test_the_collector_is_bounded_and_hands_each_record_over_once(agent) -> None:
    _, sink = agent
    c = sink.Collector(limit=10)
    assert c.put("part-h-1-a.json", "12345") == (True, False)
    assert c.put("part-h-1-a.json", "1234567") == (True, False)    # rewritten whole
    assert c.put("beat-h-1", "1234") == (False, False)             # would pass the bound
    assert c.put("lost-h-1-a", "") == (True, False)                # a marker always fits
    c.remove("lost-h-1-a")
    assert c.drain(flush=True) == {"part-h-1-a.json": "1234567", "lost-h-1-a": None}
    assert c.drain() == {} and c.size == 0
    assert c.put("beat-h-1", "1") == (True, True)                  # the flush mark carried


def test_the_driver_writes_only_the_agents_own_file_names(agent) -> None:
    rc, _ = agent
    assert rc._safe("part-h-1-a.json") and rc._safe("beat-h-1") and rc._safe("lost-h-1-a")
    for bad in ("../x", "/etc/passwd", "a/b", ".stallbench", "owner.lock", "", None):
        assert not rc._safe(bad), bad


def test_a_process_whose_figures_never_came_home_is_named_by_its_node() -> None:
    h = wire.Header(host="h", pid=1, image="a", launched=True, rank=0, world_size=3,
                    node="10.0.0.1/aaaaaaaa")
    parts = wire.Parts(trainers=(wire.Trainer(header=h),))
    beats = [wire.Beat(pid=1, batches=5, host="h", node="10.0.0.1/aaaaaaaa"),
             wire.Beat(pid=2, loaders=("D#0",), host="h", node="10.0.0.2/bbbbbbbb"),
             wire.Beat(pid=3, batches=4, exited=True, host="h"),    # ended through atexit
             wire.Beat(pid=4, host="h")]                             # no loader: not a loop
    lines = merge.unreported(parts, beats)
    assert lines[0].startswith("node 10.0.0.2/bbbbbbbb: no figures: its processes ended "
                               "without writing (pid 2: it made D#0 and ran no batch)")
    assert lines[1:] == [
        "rank 1: no figures: its process wrote none that came home (its node lost, or "
        "killed before its first write)",
        "rank 2: no figures: its process wrote none that came home (its node lost, or "
        "killed before its first write)"]
