"""`answer-eval report` over result files of every kind: written by the real writers
(`write_result`, `sweep_metrics`, `score_answers`) from hand-made records, plus the real
retrieval and stage-cost results in `eval/results/`."""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eval.commands.answers import AnswerRecord, score_answers
from eval.commands.main import main
from eval.commands.report_inputs import Request, labels, stage_segments
from eval.lib.latency_stats import LevelRun, RequestRecord, sweep_metrics
from eval.lib.questions import Question
from eval.lib.records import split
from eval.lib.results import write_result

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STAGES = {"embed": 6.0, "search": 3.0, "rerank": 90.0, "prompt": 2.0, "generate": 900.0}


def _load_file(path: Path, slo_ms: float, slowdown: float) -> list[RequestRecord]:
    """A three-rate sweep; TTFT grows with the rate and the top rate rejects some requests."""
    rng = random.Random(7)
    runs = []
    for rate in (1.0, 2.0, 4.0):
        records = []
        for n in range(24):
            if rate == 4.0 and n % 6 == 0:
                records.append(RequestRecord(f"q{n}", "rejected", n / rate, rate_rps=rate))
                continue
            server_ttft = 150.0 + rate * slowdown * rng.uniform(20, 120)
            records.append(
                RequestRecord(
                    f"q{n}",
                    "ok",
                    n / rate,
                    rate_rps=rate,
                    planned_offset_s=n / rate,
                    client_ttft_ms=server_ttft + rng.uniform(2, 8),
                    server_ttft_ms=server_ttft,
                    e2e_ms=server_ttft + 600.0,
                    itl_ms=(20.0, 21.0),
                    prompt_tokens=400,
                    cached_tokens=100,
                    stages_ms=tuple(STAGES.items()),
                )
            )
        runs.append(LevelRun("rate", rate, 24 / rate, 24 / rate + 1, tuple(records)))
    all_records = [r for run in runs for r in run.records]
    requests = [r.to_json() for r in all_records]
    for request in requests[:5]:  # a later planner's per-stage budgets
        request["plan"] = {"embed": 20, "search": 20, "rerank": 200, "prompt": 10, "generate": 250}
    write_result(
        path,
        "load",
        {"url": "http://x", "levels": [1, 2, 4], "slo_ms": slo_ms, "ttft_budget_ms": 500},
        {"questions": 24, "questions_asked": 24},
        sweep_metrics(runs, slo_ms),
        {"requests": requests},
    )
    return all_records


def _answer_records(n: int, ttft_ms: float) -> list[AnswerRecord]:
    return [
        AnswerRecord(
            question_id=f"q{i}",
            status="ok" if i != 3 else "error",
            answer="Paris [1]" if i % 2 == 0 else "I do not know",
            source_doc_ids=("d0", "d1"),
            cited_doc_ids=("d0",) if i % 2 == 0 else (),
            ttft_ms=ttft_ms + 10 * i if i != 3 else None,
            e2e_ms=ttft_ms + 10 * i + 400,
            prompt_tokens=300,
            cached_tokens=60,
        )
        for i in range(n)
    ]


def _answers_file(path: Path, top_k: int) -> dict[str, Any]:
    questions = [Question(f"q{i}", "capital of France?", ("Paris",), "d0") for i in range(8)]
    records = _answer_records(8, 300.0 + 20 * top_k)
    metrics = score_answers(questions, records)
    write_result(
        path,
        "answers",
        {"top_k": top_k, "ttft_budget_ms": 3000},
        {"questions": 8, "answerable": 8, "with_gold_passage": 8},
        metrics,
        {"requests": [asdict(r) for r in records]},
    )
    return metrics


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("results")
    retrieval = json.loads((RESULTS / "scifact-train-retrieval.json").read_text())
    retrieval["config"]["depth"] = 20
    (folder / "retrieval-depth20.json").write_text(json.dumps(retrieval))
    _load_file(folder / "load-a.json", 400.0, 1.0)
    _load_file(folder / "load-b.json", 400.0, 3.0)
    _answers_file(folder / "answers-k3.json", 3)
    _answers_file(folder / "answers-k8.json", 8)
    return {
        "retrieval": RESULTS / "scifact-train-retrieval.json",
        "retrieval20": folder / "retrieval-depth20.json",
        "load_a": folder / "load-a.json",
        "load_b": folder / "load-b.json",
        "answers_k3": folder / "answers-k3.json",
        "answers_k8": folder / "answers-k8.json",
        "stage_costs": RESULTS / "stage-costs.json",
    }


@pytest.fixture(scope="module")
def report(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main(["report", *map(str, inputs.values()), "--out", str(out)]) == 0
    return out / "report.md"


def _images(page: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())


def _row(page: Path, first_cell: str) -> str:
    """The first table row whose first cell is `first_cell`."""
    for line in page.read_text().splitlines():
        if line.startswith(f"| {first_cell} |"):
            return line
    raise AssertionError(f"no row {first_cell!r}")


def test_report_mentions_every_file_and_its_plots_are_pngs(
    report: Path, inputs: dict[str, Path]
) -> None:
    text = report.read_text()
    for path in inputs.values():
        assert f"`{path}`" in text
    images = _images(report)
    assert {
        "load-a-latency.png",
        "load-b-latency.png",
        "answers-k3-latency.png",
        "load-a-stages.png",
        "load-b-stages.png",
        "slo-attainment.png",
        "quality-depth.png",
    } <= set(images)
    for image in images:
        assert not Path(image).is_absolute()
        data = (report.parent / image).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 15_000, image  # drawn axes, lines and text, not an empty canvas
    for section in ("Summary", "Latency CDFs", "stage waterfall", "SLO attainment", "Quality"):
        assert section in text


def test_summary_numbers_match_the_inputs(report: Path, inputs: dict[str, Path]) -> None:
    retrieval = json.loads(inputs["retrieval"].read_text())
    row = _row(report, f"`{inputs['retrieval']}`")
    assert f"hybrid ndcg@10 {retrieval['metrics']['hybrid']['ndcg@10']:.3f}" in row
    assert f"recall@100 {retrieval['metrics']['dense']['recall@100']:.3f}" in row
    assert "queries 809" in row
    assert retrieval["timestamp"] in row

    answers = json.loads(inputs["answers_k3"].read_text())["metrics"]
    row = _row(report, f"`{inputs['answers_k3']}`")
    assert f"F1 {answers['f1']:.3f}" in row
    assert f"answer recall {answers['answer_recall']:.3f}" in row
    assert f"TTFT p50 {answers['ttft_ms']['p50']:.0f} ms" in row
    assert "ok 7 of 8" in row

    load = json.loads(inputs["load_b"].read_text())["metrics"]
    row = _row(report, f"`{inputs['load_b']}`")
    assert f"goodput {load['goodput_rps']:.2f} rps at TTFT ≤ 400 ms" in row
    rate4 = _row(report, "rate 4")  # load-a's level table comes first
    level = json.loads(inputs["load_a"].read_text())["metrics"]["rates"][2]
    assert f"| {level['arrivals']} | {level['ok']} | {level['rejected']} |" in rate4
    assert f"| {level['slo_attainment']:.3f} |" in rate4

    cost = json.loads(inputs["stage_costs"].read_text())
    assert f"{len(cost['costs'])} measurements" in _row(report, f"`{inputs['stage_costs']}`")


def test_waterfall_splits_the_ttft_into_stages(report: Path, inputs: dict[str, Path]) -> None:
    requests = json.loads(inputs["load_a"].read_text())["requests"]
    ok = [r for r in requests if r["status"] == "ok" and r["rate_rps"] == 1.0]
    row = _row(report, f"rate 1 rps · p50 (n={len(ok)})").split(" | ")
    assert row[1:5] == ["6.0", "3.0", "90.0", "2.0"]  # embed, search, rerank, prompt
    first_token = np.median([r["server_ttft_ms"] - 101.0 for r in ok])
    assert row[5] == f"{first_token:.0f}"
    assert row[-1].startswith("500")  # the TTFT budget of the run
    planned = _row(report, "rate 1 rps · planned").split(" | ")
    assert planned[1:6] == ["20.0", "20.0", "200", "10.0", "250"]


def test_a_committed_summary_reports_with_its_records_beside_it(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """The same report, with the per-request records whole in the JSON or split off beside it."""
    whole, summaries = tmp_path / "whole", tmp_path / "summaries"
    for folder in (whole, summaries):
        folder.mkdir()
        for name in ("load_a", "answers_k3"):
            (folder / inputs[name].name).write_bytes(inputs[name].read_bytes())
    for path in summaries.iterdir():
        assert split(path) is not None
        assert "requests" not in json.loads(path.read_text())

    pages = []
    for folder in (whole, summaries):
        out = tmp_path / f"report-{folder.name}"
        files = sorted(folder.glob("*.json"))
        assert main(["report", *map(str, files), "--out", str(out)]) == 0
        pages.append((out / "report.md").read_text().replace(str(folder), "FOLDER"))
    assert pages[0] == pages[1]
    assert "rate 1 rps · p50" in pages[1]  # the waterfall, drawn from the records


def test_a_summary_whose_records_are_gone_is_refused_naming_it(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / inputs["load_a"].name
    path.write_bytes(inputs["load_a"].read_bytes())
    records = split(path)
    assert records is not None
    records.unlink()
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: cannot read its records file")
    assert err.count("\n") == 1


def test_stage_segments_arithmetic() -> None:
    record = Request(
        status="ok",
        client_ttft_ms=410.0,
        server_ttft_ms=400.0,
        stages_ms={"generate": 900.0, "rerank": 100.0, "embed": 10.0},
    )
    assert stage_segments(record) == {
        "embed": 10.0,
        "rerank": 100.0,
        "first token": 290.0,
        "client/network": 10.0,
    }
    assert stage_segments(record.model_copy(update={"status": "rejected"})) is None


def test_one_retrieval_file_still_plots_its_single_point(tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main(["report", str(RESULTS / "scifact-train-retrieval.json"), "--out", str(out)]) == 0
    assert _images(out / "report.md") == ["quality-depth.png"]
    assert (out / "quality-depth.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "Latency CDFs" not in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"command": "mystery", "metrics": {}}', "command 'mystery'"),
        ('{"metrics": {}}', "command None"),
        ('{"command": "retrieval", "metrics": "high"}', "`metrics`"),
        ('{"command": "load", "metrics": {"rates": [{"ok": 1}]}}', "`metrics.rates.0.arrivals`"),
        ('{"command": "answers", "metrics": {}, "requests": [{"e2e_ms": "x"}]}', "requests.0"),
        ('{"costs": [{"stage": "embed"}]}', "malformed stage-costs result: `costs.0.setting`"),
    ],
)
def test_a_malformed_file_is_refused_in_one_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    inputs: dict[str, Path],
    content: str,
    reason: str,
) -> None:
    bad = tmp_path / "bad-result.json"
    bad.write_text(content)
    out = tmp_path / "report"
    assert main(["report", str(inputs["retrieval"]), str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert err.startswith(f"error: {bad}: ")
    assert reason in err
    assert not (out / "report.md").exists()


def test_a_missing_file_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.json"
    assert main(["report", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {missing}: cannot read")


def test_labels_name_clashing_files_by_their_folder() -> None:
    paths = [Path("a/x.json"), Path("b/x.json"), Path("y.json"), Path("c/x.json"), Path("c/x.csv")]
    assert labels(paths) == ["a/x", "b/x", "y", "c/x (4)", "c/x (5)"]
