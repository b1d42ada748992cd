"""``@job`` keeps the handler's parameters for type checkers: mypy checks ``enqueue()``'s arguments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
from django_durq import JobContext, job


@job(name="typing.transcode")
def transcode(ctx: JobContext, video_id: int, quality: str = "720p") -> dict[str, object]:
    return {"video_id": video_id}


@job
def ping(ctx: JobContext) -> str:
    return "pong"


reveal_type(transcode.enqueue)  # line 15
reveal_type(transcode.using(priority=3).enqueue)
transcode.enqueue(7, quality="1080p")
transcode.using(unique="k").enqueue(video_id=8)
transcode.enqueue(video_id="seven")  # line 19
transcode.enqueue(7, qualty="1080p")
ping.enqueue(1)
reveal_type(ping(JobContext.__new__(JobContext)))
"""


def test_mypy_sees_the_handlers_parameters_on_enqueue_and_using(tmp_path):
    api = pytest.importorskip("mypy.api")
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    out, err, _ = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary", str(sample)])
    lines = {}
    for line in out.splitlines():
        match = re.match(r".*sample\.py:(\d+): (\w+): (.*)", line)  # a cached result may name an earlier tmp_path
        if match and match[2] in ("note", "error") and not match[3].startswith('"enqueue" defined in'):
            lines.setdefault(int(match[1]), []).append(match[3].replace("builtins.", ""))  # mypy < 1.11 spells it out
    assert err == ""
    signature = 'Revealed type is "def (video_id: int, quality: str =) -> django_durq.models.Job"'
    assert lines[15] == lines[16] == [signature]
    assert 17 not in lines and 18 not in lines
    assert 'Argument "video_id" to "enqueue" of "JobDefinition" has incompatible type "str"; expected "int"' in lines[19][0]
    assert 'Unexpected keyword argument "qualty" for "enqueue" of "JobDefinition"; did you mean "quality"?' in lines[20][0]
    assert 'Too many arguments for "enqueue" of "JobDefinition"' in lines[21][0]
    assert lines[22] == ['Revealed type is "str"']
