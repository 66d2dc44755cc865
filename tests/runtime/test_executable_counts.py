"""The executable-cache counters behind ``torch.tpu._get_cache_stats()``, on their own (no device, no subprocess)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpu_agent.runtime.emulated import compile_cache


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    compile_cache.clear()  # forgets executables, not the counts (as torch.tpu._clear_cache): those start at 0 here
    monkeypatch.setattr(compile_cache, "MAX_ENTRIES", 2)
    monkeypatch.setattr(compile_cache, "requests", 0)
    monkeypatch.setattr(compile_cache, "hits", 0)
    yield
    compile_cache.clear()


def test_an_unhashable_key_is_not_counted_rather_than_raising(cache: None) -> None:
    compile_cache.request(("op", [1, 2]))  # a list inside the signature: no key
    assert compile_cache.stats()[:2] == (0, 0)


def test_a_hit_in_the_callers_own_cache_is_a_hit_after_this_table_let_it_go(cache: None) -> None:
    for key in ("a", "b", "c"):  # "a" is evicted past MAX_ENTRIES
        compile_cache.record_build(key, 1_000)
    assert compile_cache.executables() == 2
    compile_cache.record_hit("a")
    assert compile_cache.stats()[:2] == (4, 1)


def test_a_call_the_signature_cannot_key_is_not_counted(cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_cache, "op_key", lambda func, args, kwargs: None)
    compile_cache.request_op(object(), (), {})
    compile_cache.request_op(object(), (), {})
    assert compile_cache.stats()[:2] == (0, 0)
