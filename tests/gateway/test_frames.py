"""The byte-template frames are exactly the Structs' encoding, for every kind of frame."""

from __future__ import annotations

import msgspec
import pytest

from cascade.schemas import CascadeInfo, ChatCompletionChunk, ChunkChoice, Delta, Usage
from cascade.service.frames import DONE, ChunkFrames, sse

TEXTS = ["", "hello", ' "quoted" ', "line\nbreak\ttab", "\\ backslash", "ünïcödé 数学 🚀", "\x00\x1f", '"index":0']


def reference(choices: list[ChunkChoice], **fields: object) -> bytes:
    chunk = ChatCompletionChunk(id="chatcmpl-abc", object="chat.completion.chunk", created=1700000000,
                                model='tier "x"', choices=choices, **fields)  # type: ignore[arg-type]
    return sse(msgspec.json.encode(chunk))


@pytest.fixture
def frames() -> ChunkFrames:
    return ChunkFrames("chatcmpl-abc", 1700000000, 'tier "x"')


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("index", [0, 1, 17])
def test_content_frame_matches_struct_encoding(frames: ChunkFrames, text: str, index: int) -> None:
    assert frames.content(index, text) == reference([ChunkChoice(index=index, delta=Delta(content=text))])


def test_reasoning_frame_matches_struct_encoding(frames: ChunkFrames) -> None:
    both = {"reasoning_content": "think", "reasoning": "think"}  # under both names by default
    expected = reference([ChunkChoice(index=2, delta=Delta(content="a", **both))])
    assert frames.content(2, "a", reasoning="think") == expected
    expected = reference([ChunkChoice(index=0, delta=Delta(**both))])
    assert frames.content(0, "", reasoning="think") == expected


@pytest.mark.parametrize("names", [("reasoning",), ("reasoning_content",), ()])
def test_reasoning_goes_under_the_configured_names_only(names: tuple[str, ...]) -> None:
    frames = ChunkFrames("chatcmpl-abc", 1700000000, 'tier "x"', names)
    fields = {name: "think" for name in names}
    expected = reference([ChunkChoice(index=0, delta=Delta(content="a", **fields))])
    assert frames.content(0, "a", reasoning="think") == expected
    if names:
        assert frames.content(0, "", reasoning="think") == reference([ChunkChoice(index=0, delta=Delta(**fields))])
    else:  # nothing to show: no frame at all
        assert frames.content(0, "", reasoning="think") == b""


def test_every_chunk_names_its_object(frames: ChunkFrames) -> None:
    info = CascadeInfo(tier=0, tier_name="t", quality="fast")
    for frame in (frames.content(0, "x"), frames.role(2, info), frames.finish(0, "stop"),
                  frames.tail(info, Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3))):
        payload = frame.split(b"\n\n")[0].removeprefix(b"data: ")
        assert msgspec.json.decode(payload)["object"] == "chat.completion.chunk"


def test_role_finish_and_tail_frames(frames: ChunkFrames) -> None:
    info = CascadeInfo(tier=1, tier_name="t", quality="best", difficulty=0.5, router="heuristic")
    assert frames.role(2, info) == reference(
        [ChunkChoice(index=i, delta=Delta(role="assistant", content="")) for i in range(2)], cascade=info)
    assert frames.finish(1, "length") == reference([ChunkChoice(index=1, delta=Delta(), finish_reason="length")])
    usage = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    assert frames.tail(info, usage) == reference([], cascade=info, usage=usage) + DONE
    assert frames.tail(info, None) == reference([], cascade=info) + DONE
