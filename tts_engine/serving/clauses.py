"""Turn text that arrives in pieces (an LLM streaming tokens) into speakable clauses.

A voice agent pushes text with `final=False` while the LLM is still writing. Speech should start as
soon as the first clause is complete and continue as text arrives, without cutting words in half:
a clause ends at sentence punctuation, or at a comma/semicolon/colon once it is long enough to be
worth a separate utterance, or at a newline. `final=True` flushes whatever is left.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?。！？…]+[\"'”’)\]]*(?=\s)")  # "3." + "14" must not split
_SOFT_BREAK = re.compile(r"[,;:，；：—]+(?=\s)")
MIN_SOFT_CLAUSE = 24     # characters before a comma is allowed to end a clause
MAX_CLAUSE = 240         # a clause with no punctuation at all is cut at a space past this length


class ClauseAssembler:
    def __init__(self, min_soft_clause: int = MIN_SOFT_CLAUSE, max_clause: int = MAX_CLAUSE):
        self.min_soft_clause = min_soft_clause
        self.max_clause = max_clause
        self.buffer = ""

    def push(self, text: str, final: bool = False) -> list[str]:
        """Append a piece; return the clauses that are now complete (all of the rest if final)."""
        self.buffer += text
        clauses: list[str] = []
        while True:
            cut = self._next_cut()
            if cut is None:
                break
            clause, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:]
            if clause:
                clauses.append(clause)
        if final:
            rest, self.buffer = self.buffer.strip(), ""
            if rest:
                clauses.append(rest)
        return clauses

    def _next_cut(self) -> int | None:
        text = self.buffer
        newline = text.find("\n")
        sentence = _SENTENCE_END.search(text)
        cuts = [m for m in (newline + 1 if newline >= 0 else None, sentence.end() if sentence else None)
                if m is not None]
        for soft in _SOFT_BREAK.finditer(text):
            if len(text[:soft.end()].strip()) >= self.min_soft_clause:
                cuts.append(soft.end())
                break
        if cuts:
            return min(cuts)
        if len(text) > self.max_clause:
            space = text.rfind(" ", 0, self.max_clause)
            return space + 1 if space > 0 else self.max_clause
        return None

    def clear(self) -> None:
        self.buffer = ""
