"""The page allocator of the paged KV cache: free list, reference counts, page tables.

    manager = BlockManager(num_pages=64, page_size=16)
    manager.allocate_prompt(seq)        # pages for the prompt's tokens
    copy = manager.fork(leader, other)  # share full pages, (src, dst) for the partial one
    manager.append_slot(seq)            # a new page when the next token starts one
    manager.append_slot(seq, ahead=1)   # the same for the step after one still in flight
    manager.release(seq)                # pages whose count drops to 0 are free at once

A page is held by every sequence whose page table lists it; it returns to the free list when
the last holder releases it. Only full pages are ever shared (the n samples of a prompt), so
a shared page is never written again: the partial last page is copied per sample.
"""

from __future__ import annotations

from collections import deque

from sparrow.engine.sequence import Sequence


class OutOfPages(RuntimeError):
    """No free page; the scheduler's admission rule is meant to make this impossible."""


class BlockManager:
    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._refcount = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    # single pages

    def allocate(self) -> int:
        if not self._free:
            raise OutOfPages(f"all {self.num_pages} KV pages are in use")
        page = self._free.popleft()
        self._refcount[page] = 1
        return page

    def share(self, page: int) -> None:
        if self._refcount[page] < 1:
            raise ValueError(f"page {page} is free and cannot be shared")
        self._refcount[page] += 1

    def free(self, page: int) -> None:
        if self._refcount[page] < 1:
            raise ValueError(f"page {page} is already free")
        self._refcount[page] -= 1
        if self._refcount[page] == 0:
            self._free.append(page)

    # sequences

    def allocate_prompt(self, seq: Sequence) -> None:
        """Pages for every token of a sequence about to be prefilled."""
        if seq.page_table:
            raise ValueError(f"sequence {seq.seq_id} already holds pages")
        needed = self.pages_for_tokens(seq.num_tokens)
        if needed > self.num_free:
            raise OutOfPages(f"prefill needs {needed} pages, {self.num_free} are free")
        seq.page_table = [self.allocate() for _ in range(needed)]

    def append_slot(self, seq: Sequence, ahead: int = 0) -> None:
        """Before a decode step: make room for the input token at position num_tokens - 1
        + ahead (ahead = 1: the token of a step still in flight, not yet appended)."""
        needed = self.pages_for_tokens(seq.num_tokens + ahead)
        if needed > len(seq.page_table) + 1:
            raise ValueError(f"sequence {seq.seq_id} is more than one page behind its tokens")
        if needed == len(seq.page_table) + 1:
            seq.page_table.append(self.allocate())

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Give child the parent's cached prompt: full pages by reference, the partial page
        copied. Returns (source page, new page) for the caller to copy K/V, or None."""
        if child.page_table:
            raise ValueError(f"sequence {child.seq_id} already holds pages")
        cached = parent.num_tokens  # a just-prefilled parent has all its tokens cached
        full = cached // self.page_size
        for page in parent.page_table[:full]:
            self.share(page)
        child.page_table = list(parent.page_table[:full])
        if full == len(parent.page_table):
            return None
        copy = self.allocate()
        child.page_table.append(copy)
        return parent.page_table[full], copy

    def release(self, seq: Sequence) -> None:
        for page in reversed(seq.page_table):
            self.free(page)
        seq.page_table = []

    def slot(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (page * page_size + offset) of a token position of seq."""
        page, offset = divmod(position, self.page_size)
        if page >= len(seq.page_table):
            raise ValueError(
                f"sequence {seq.seq_id} holds {len(seq.page_table)} pages, none for "
                f"position {position}"
            )
        return seq.page_table[page] * self.page_size + offset
