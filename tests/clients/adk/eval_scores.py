"""google-adk's own scores of agentd's eval results, for tests/eval_cli.rs.

Reads a file of {"config": <test_config.json>, "cases": [{"actual": [...], "expected": [...]}]}
(invocations in the file form, as agentd's result file holds them), scores each case
with ADK's evaluators for the config's criteria and prints {"cases": [{"<metric>": {"score": ..., "status": ...,
"per_invocation": [...]}}]}.

The evaluators are the ones ADK's metric registry maps these metrics to
(`tool_trajectory_avg_score`: TrajectoryEvaluator; `response_match_score`: ResponseEvaluator,
which hands it to RougeEvaluator). The registry itself is not imported: it pulls in the
Vertex AI SDK (google-adk's `[eval]` extra) for the metrics agentd does not offer.
"""

import asyncio
import inspect
import json
import sys

from google.adk.evaluation.eval_case import Invocation
from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
from google.adk.evaluation.final_response_match_v1 import RougeEvaluator
from google.adk.evaluation.trajectory_evaluator import TrajectoryEvaluator

EVALUATORS = {
    "tool_trajectory_avg_score": TrajectoryEvaluator,
    "response_match_score": RougeEvaluator,
}


async def main():
    with open(sys.argv[1]) as f:
        given = json.load(f)
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
            }
        out.append(scores)
    print(json.dumps({"cases": out}))


asyncio.run(main())
