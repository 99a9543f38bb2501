"""The engine's side of a feed (Engine.generate(feed=...)): requests taken while it runs.

A feed answers take() with a request `(label, prompt, params)`, an empty tuple for "none now,
ask again" or None for "no more", and hears full() when the engine stops taking for lack of
room. sparrow/runtime/rollout/dispatch.py's PromptSource is the feed several engines share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from sparrow.engine.scheduler import Scheduler, SequenceGroup

POLL_S = 0.005  # a feed with none for now and nothing to run: its engine asks again after this


class FeedPull:
    """generate()'s feed: takes requests while the batch, beyond what waits, has room for one
    like the last taken (requests are not seen before they are taken: an engine that took one
    it cannot start yet would hold it from an engine with room)."""

    def __init__(
        self,
        feed: Any,
        make_group: Callable[[int, list, Any], SequenceGroup],
        groups: list[SequenceGroup],
        bar: tqdm,
    ):
        self.feed, self.make_group, self.groups, self.bar = feed, make_group, groups, bar
        self.open = True
        self.size = (1, 1)  # the last request's samples and pages
        self.said_full = False  # feed.full() once per stretch without room

    def fill(self, scheduler: Scheduler) -> None:
        if not self.open:
            return
        while all(left >= need for left, need in zip(scheduler.room_after_waiting(), self.size)):
            request = self.feed.take()
            if request is None:
                self.open = False
                return
            self.said_full = False
            if not request:
                return  # none for now
            label, prompt, params = request
            group = self.make_group(int(label), list(prompt), params)
            self.groups.append(group)
            self.size = (len(group.samples), scheduler.pages_needed(group))
            scheduler.add(group)
            self.bar.total += len(group.samples) * params.max_new_tokens
        if not self.said_full:
            self.feed.full()
            self.said_full = True
