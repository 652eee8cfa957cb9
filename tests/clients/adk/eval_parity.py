"""What google-adk itself makes of eval sets, for tests/evals.rs.

`adk_file`: an eval set written by ADK's own file writer (LocalEvalSetsManager), with what a
real file holds: tool calls whose arguments are not in sorted order, rubrics, intermediate
responses, a final state, non-ASCII text. Prints {"file": <its text>}.

`from_session IN.json`: IN holds agentd's `GET` of a session and the set's and case's ids,
timestamps and initial state's keys. Makes the case as ADK's dev server's `add_session` does
(`convert_session_to_eval_invocations`), adds it with ADK's LocalEvalSetsManager to a set of
that head, and prints {"file": <the set file ADK wrote>, "wire_case": <the case as ADK's dev
server answers GET eval-cases/{id}>}.

`metrics_info`: what ADK's dev server answers `GET /dev/apps/{app}/metrics-info` with, for the
metrics agentd computes (ADK lists every metric it registers; its registry itself needs the
Vertex AI SDK), as {"wire": <the body's text>}.
"""

import json
import os
import sys
import tempfile

from google.adk.cli.utils.evals import convert_session_to_eval_invocations
from google.adk.evaluation.eval_case import (EvalCase, IntermediateData, Invocation,
                                             SessionInput)
from google.adk.evaluation.eval_rubrics import Rubric, RubricContent
from google.adk.evaluation.eval_set import EvalSet
from google.adk.evaluation.local_eval_sets_manager import LocalEvalSetsManager
from google.adk.sessions.session import Session
from google.genai import types


def write(manager, app, eval_set):
    path = manager._get_eval_set_file_path(app, eval_set.eval_set_id)
    manager._write_eval_set_to_path(path, eval_set)
    with open(path, encoding="utf-8") as f:
        return f.read()


def adk_file():
    with tempfile.TemporaryDirectory() as tmp:
        manager = LocalEvalSetsManager(tmp)
        invocation = Invocation(
            invocation_id="e-1",
            user_content=types.Content(
                role="user", parts=[types.Part(text="Wie warm ist es in Zürich? 🌡")]),
            final_response=types.Content(
                role="model", parts=[types.Part(text="Es sind 21 °C.")]),
            intermediate_data=IntermediateData(
                tool_uses=[types.FunctionCall(
                    name="get_weather", args={"zeta": 1, "alpha": {"z": True, "a": None}})],
                intermediate_responses=[("helper", [types.Part(text="looking it up")])],
            ),
            creation_timestamp=1764669123.4567891,
        )
        case = EvalCase(
            eval_id="weather_zurich",
            conversation=[invocation],
            session_input=SessionInput(app_name="greeter", user_id="u1",
                                       state={"z_key": "", "a_key": 2}),
            creation_timestamp=1764669124.5,
            rubrics=[Rubric(rubric_id="r1",
                            rubric_content=RubricContent(text_property="Says the °C."))],
            final_session_state={"last": "Es sind 21 °C.", "count": 1},
        )
        eval_set = EvalSet(eval_set_id="weather", name="Weather questions",
                           description="Asked in German.", eval_cases=[case],
                           creation_timestamp=1764669000.125)
        print(json.dumps({"file": write(manager, "greeter", eval_set)}))


def from_session(path):
    with open(path, encoding="utf-8") as f:
        given = json.load(f)
    session = Session.model_validate(given["session"])
    case = EvalCase(
        eval_id=given["eval_id"],
        conversation=convert_session_to_eval_invocations(session),
        session_input=SessionInput(app_name=session.app_name, user_id=session.user_id,
                                   state={k: "" for k in given["state_keys"]}),
        creation_timestamp=given["creation_timestamp"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        manager = LocalEvalSetsManager(tmp)
        head = EvalSet(eval_set_id=given["set_id"], name=given["set_id"], eval_cases=[],
                       creation_timestamp=given["set_creation_timestamp"])
        write(manager, session.app_name, head)
        manager.add_eval_case(session.app_name, given["set_id"], case)
        path = manager._get_eval_set_file_path(session.app_name, given["set_id"])
        with open(path, encoding="utf-8") as f:
            text = f.read()
        stored = manager.get_eval_case(session.app_name, given["set_id"], given["eval_id"])
        wire = stored.model_dump(exclude_none=True, by_alias=True, mode="json")
    print(json.dumps({"file": text, "wire_case": json.dumps(wire, ensure_ascii=False,
                                                            separators=(",", ":"))}))


def metrics_info():
    from google.adk.cli.dev_server import ListMetricsInfoResponse
    from google.adk.evaluation.metric_info_providers import (
        FinalResponseMatchV2EvaluatorMetricInfoProvider, ResponseEvaluatorMetricInfoProvider,
        RubricBasedFinalResponseQualityV1EvaluatorMetricInfoProvider,
        RubricBasedToolUseV1EvaluatorMetricInfoProvider, TrajectoryEvaluatorMetricInfoProvider)
    answer = ListMetricsInfoResponse(metrics_info=[
        TrajectoryEvaluatorMetricInfoProvider().get_metric_info(),
        ResponseEvaluatorMetricInfoProvider("response_match_score").get_metric_info(),
        FinalResponseMatchV2EvaluatorMetricInfoProvider().get_metric_info(),
        RubricBasedFinalResponseQualityV1EvaluatorMetricInfoProvider().get_metric_info(),
        RubricBasedToolUseV1EvaluatorMetricInfoProvider().get_metric_info(),
    ])
    # FastAPI's response_model_exclude_none, by alias.
    print(json.dumps({"wire": answer.model_dump_json(by_alias=True, exclude_none=True)}))


if __name__ == "__main__":
    {"adk_file": lambda: adk_file(), "from_session": lambda: from_session(sys.argv[2]),
     "metrics_info": lambda: metrics_info()}[sys.argv[1]]()
