"""google-adk's own scores of agentd's eval results, for tests/eval_cli/.

Reads a file of {"config": <test_config.json>, "cases": [{"actual": [...], "expected": [...]}],
"judge_answers": [...]} (invocations in the file form, as agentd's result file holds them),
scores each case with ADK's evaluators for the config's criteria and prints {"cases":
[{"<metric>": {"score": ..., "status": ..., "per_invocation": [...]}}]}.

The evaluators are the ones ADK's metric registry maps these metrics to
(`tool_trajectory_avg_score`: TrajectoryEvaluator; `response_match_score`: ResponseEvaluator,
which hands it to RougeEvaluator; `final_response_match_v2`: FinalResponseMatchV2Evaluator;
the `rubric_based_*` ones: their RubricBased…V1Evaluator).
The registry itself is not imported: it pulls in the Vertex AI SDK (google-adk's `[eval]`
extra) for the metrics agentd does not offer.

The judge of the LLM-as-judge metrics is a scripted model: each call answers the next text of
`judge_answers`, in the order ADK asks (case by case, metric by metric, invocation by
invocation, sample by sample), so ADK's reading of the answers and its majority and fraction
are what is compared.
"""

import asyncio
import inspect
import json
import sys

from google.adk.evaluation.eval_case import Invocation
from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
from google.adk.evaluation.final_response_match_v1 import RougeEvaluator
from google.adk.evaluation.final_response_match_v2 import FinalResponseMatchV2Evaluator
from google.adk.evaluation.rubric_based_final_response_quality_v1 import (
    RubricBasedFinalResponseQualityV1Evaluator,
)
from google.adk.evaluation.rubric_based_tool_use_quality_v1 import RubricBasedToolUseV1Evaluator
from google.adk.evaluation.trajectory_evaluator import TrajectoryEvaluator
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.genai import types

JUDGE_ANSWERS = []


class ScriptedJudge(BaseLlm):
    async def generate_content_async(self, llm_request, stream=False):
        text = JUDGE_ANSWERS.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


class ScriptedFinalResponseMatchV2(FinalResponseMatchV2Evaluator):
    def _setup_auto_rater(self):
        return ScriptedJudge(model=self._judge_model_options.judge_model)


class ScriptedRubricFinalResponse(RubricBasedFinalResponseQualityV1Evaluator):
    def _setup_auto_rater(self):
        return ScriptedJudge(model=self._judge_model_options.judge_model)


class ScriptedRubricToolUse(RubricBasedToolUseV1Evaluator):
    def _setup_auto_rater(self):
        return ScriptedJudge(model=self._judge_model_options.judge_model)


EVALUATORS = {
    "tool_trajectory_avg_score": TrajectoryEvaluator,
    "response_match_score": RougeEvaluator,
    "final_response_match_v2": ScriptedFinalResponseMatchV2,
    "rubric_based_final_response_quality_v1": ScriptedRubricFinalResponse,
    "rubric_based_tool_use_quality_v1": ScriptedRubricToolUse,
}


async def main():
    with open(sys.argv[1]) as f:
        given = json.load(f)
    JUDGE_ANSWERS.extend(given.get("judge_answers", []))
    config = EvalConfig.model_validate(given["config"])
    metrics = [m for m in get_eval_metrics_from_config(config) if m.metric_name in config.criteria]
    out = []
    for case in given["cases"]:
        actual = [Invocation.model_validate(i) for i in case["actual"]]
        expected = [Invocation.model_validate(i) for i in case["expected"]]
        scores = {}
        for metric in metrics:
            evaluator = EVALUATORS[metric.metric_name](eval_metric=metric)
            result = evaluator.evaluate_invocations(actual, expected)
            if inspect.isawaitable(result):
                result = await result
            scores[metric.metric_name] = {
                "score": result.overall_score,
                "status": int(result.overall_eval_status.value),
                "per_invocation": [r.score for r in result.per_invocation_results],
                "rubric_scores": [
                    [r.rubric_id, r.score] for r in (result.overall_rubric_scores or [])
                ],
            }
        out.append(scores)
    if JUDGE_ANSWERS:
        raise SystemExit(f"{len(JUDGE_ANSWERS)} judge answers were not asked for")
    print(json.dumps({"cases": out}))


asyncio.run(main())
