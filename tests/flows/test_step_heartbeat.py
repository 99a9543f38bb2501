"""A step's subflow runs without Prefect's flow-run heartbeat (whose thread the engine joins at
the end of every flow run, up to a second), while the settings outside it keep theirs."""

from sparrow.flows.prefect_env import quiet_prefect

quiet_prefect()


def test_the_step_context_turns_the_heartbeat_off_and_restores_it():
    from prefect.settings import get_current_settings, temporary_settings

    from sparrow.flows.train import _no_heartbeat

    with temporary_settings(updates={"flows.heartbeat_frequency": 60}):
        with _no_heartbeat():
            assert get_current_settings().flows.heartbeat_frequency is None
        assert get_current_settings().flows.heartbeat_frequency == 60
