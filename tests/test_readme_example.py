"""The scenario-level test example of the README, kept working."""
pytest_plugins = ["tools.pytest_plugin"]


async def test_reduce_under_delay(vclock, emu_sim):
    run = await emu_sim.run("scenarios/demo/reduce.yaml", set=["workload.params.rounds=1"],
                            faults=[{"kind": "delay", "link": "cube05/pe1*", "delay": "50ns"}])
    run.assert_status("finished")
    run.assert_latency(link="cube00/pe1*", max="200ns")
    assert run.count("fault") == 1
