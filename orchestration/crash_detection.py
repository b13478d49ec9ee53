"""A flow run whose process died (SIGKILL, out of memory, a lost machine) is marked Crashed by the Prefect server.

Such a run says nothing as it dies and would show as Running for ever. Each run sends a heartbeat event every
PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds; the automation here, Prefect's own recipe for a self-hosted server,
marks a tuneline run Crashed once MISSED_HEARTBEATS of them have not come. The flow makes sure it exists on the
server it reports to, so every way of starting a run gets it without a set-up step.
"""

from __future__ import annotations

from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.settings import get_current_settings

AUTOMATION_NAME = "tuneline: mark runs without heartbeats crashed"
MISSED_HEARTBEATS = 3
FLOW_NAMES = ["finetune"]


def crash_detection(heartbeat_s: int) -> Automation:
    """After each heartbeat of a tuneline flow run, another event of that run is due within the allowed silence."""
    return Automation(
        name=AUTOMATION_NAME,
        description="A tuneline flow run that stopped sending heartbeats died without a word: mark it Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.*"},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": FLOW_NAMES}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=MISSED_HEARTBEATS * heartbeat_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {MISSED_HEARTBEATS * heartbeat_s} s: the run's process "
                                            "died; run the same command again to resume it")],
    )


def ensure_crash_detection() -> None:
    """Create the automation on this run's Prefect server, or bring its allowed silence in line with the heartbeat
    frequency; none where heartbeats are off. An automation a user disabled stays disabled."""
    heartbeat_s = get_current_settings().flows.heartbeat_frequency
    if heartbeat_s is None:
        return
    wanted = crash_detection(heartbeat_s)
    try:
        found = Automation.read(name=AUTOMATION_NAME)
    except ValueError:  # none by that name
        wanted.create()
        return
    if found.trigger.within != wanted.trigger.within:
        found.trigger, found.actions = wanted.trigger, wanted.actions
        found.update()
