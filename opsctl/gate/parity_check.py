"""The offline parity check (``opsctl parity check FILE|-``): journal entries in, the gate's verdict out, decided by
the same parser (``opsctl/gate/lines.py``) and the same ``GateState`` and ``judge`` as a deploy's gate.

Pure over data: :class:`~opsctl.journal.reader.JournalReader` turns input lines into journal entries;
:func:`check_entries` finds the invocations in them and judges them (:mod:`opsctl.gate.parity_report` holds what it
found). Reading the file or stdin is the CLI's job (``opsctl/cli/parity.py``). Memory is bounded: each line is
judged as it comes and only the listed lines (counted ones, up to ``MAX_LISTED``, and the first few ignored ones)
and each invocation's figures are kept.

The differences from a live gate are only the ones an offline journal forces: there is no unit to observe and
no clock, so the end of an invocation's text is its deadline (``GateState.conclude``): K passes on every rank ->
PASS; a failing or malformed line -> FAIL; a silent rank or no line -> NODATA; anything else -> INCONCLUSIVE.

Which lines one gate run judges (docs/gate.md "Checking a journal offline"): with ``token`` given, every line,
judged with that token, as the live gate would. Without it, the text is cut into invocations: a new token on a
parity line starts one, and so does a restart boundary (systemd's ``Starting``/``Started``, the launcher's
start line, journalctl's ``-- Boot`` line, a new ``_SYSTEMD_INVOCATION_ID`` in JSON) followed by a parity line
without the previous token. Each invocation is judged with its own token, as its deploy's gate was; the verdict
is the **last** one's.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..inventory import GateSettings
from ..journal.entry import Entry
from ..journal.reader import InputFormat, JournalReader
from .decision import GateState, judge, split_piece_claimed
from .lines import MARKER, KdtreeLine, ParityLine, fast_fields, malformed_line, parse_line
from .ownership import MIN_TOKEN_PIECE, loose_token
from .parity_report import Invocation, ParityCheck
from .verdicts import line_verdict


class _Checker:
    """Cuts entries into invocations (without a given token) and feeds each one's gate."""

    def __init__(
        self, settings: GateSettings, tp: int | None, token: str | None, reader: JournalReader | None = None
    ) -> None:
        self.settings, self.tp, self.given = settings, tp, token
        self.reader = reader
        self.done: list[Invocation] = []
        self.current = self._new(1, 1)
        self._watch(token)

    def _watch(self, token: str | None) -> None:
        """Tell the reader the judged invocation's token (a text line holding it comes even without the marker)."""
        if self.reader is not None:
            self.reader.watched = None if token is None else token[-MIN_TOKEN_PIECE:]
            self.reader.rests = self.current.state.cut_rests

    def _new(self, index: int, first_line: int) -> Invocation:
        state = GateState(
            settings=self.settings,
            started_at=0.0,
            deadline_s=self.settings.deadline_s,
            expected_ranks=self.tp,
            token=self.given,
        )
        return Invocation(index=index, state=state, first_line=first_line)

    def _start_new(self, first_line: int) -> Invocation:
        old = self.current
        if self.done:
            self.done[-1].lines = []  # two back: never judged, never merged into; keep its figures only
        self.done.append(old)
        self.current = self._new(old.index + 1, first_line)
        return self.current

    def _place(self, token: str | None, number: int) -> Invocation:
        """The invocation a parity line carrying ``token`` (None: none) belongs to."""
        cur = self.current
        if not cur.token_fixed:
            prev = self.done[-1] if self.done else None
            if token is not None and prev is not None and prev.token == token:
                self.done.pop()  # the same token after a boundary: the same deploy's automatic restart
                prev.absorb(cur)
                self.current = prev
                return prev
            cur.state.token, cur.token_fixed = token, True
            self._watch(token)
            return cur
        if token is not None and cur.token is not None and token != cur.token and token.startswith(cur.token):
            # The run's first line showed a token cut short (judged with it: a FAIL that stands); this is the whole.
            cur.state.token = token
            self._watch(token)
            return cur
        if token is not None and token != cur.token and not (cur.token or "").startswith(token):
            # (a token cut short, a strict prefix of this one's, stays here: the gate fails it)
            self._start_new(number)
            return self._place(token, number)
        return cur  # the same token, or a line without one inside a token's run (ignored there)

    def feed(self, entry: Entry) -> None:
        """One entry by the full path (``check_entries`` offers it to :meth:`_late` first)."""
        number, message = entry.number, entry.message
        cur = self.current
        if entry.line_break and split_piece_claimed(cur.state, message):
            # A piece of a message journald cut: never placed by the token it shows (it may show a cut one).
            j = judge(cur.state, message, 0.0, journal_prefix=entry.prefixed, split=entry.line_break)
            assert j is not None
            cur.add(number, j)
            return
        marked = MARKER in message
        rec = parse_line(message, journal_prefix=entry.prefixed) if marked else None
        if rec is None and marked and entry.unreadable:
            rec = malformed_line(message, "a JSON line that does not parse")
        if self.given is None:
            cur = self._invocation_of(entry, rec)
        if isinstance(rec, ParityLine):
            decided = cur.state.decided
            cur.add_line(number, rec, cur.state.feed(rec, 0.0), decided)  # judge_record's steps, reason on demand
        elif (rec is None and marked) or (
            (own := cur.token) is not None and (own[-MIN_TOKEN_PIECE:] in message or cur.state.cut_rests)
        ):
            # The marker inside another message (IGNORED; a FAIL when it holds the token), the token in a message
            # without the marker (a FAIL), or a message that begins with the rest of a token cut short (a FAIL):
            # the gate's judge says which.
            j = judge(cur.state, message, 0.0, journal_prefix=entry.prefixed)
            if j is not None:
                cur.add(number, j)
            else:
                cur.last_line = number
        else:
            cur.last_line = number

    def _invocation_of(self, entry: Entry, rec: KdtreeLine | None) -> Invocation:
        """Without a given token: the invocation an entry (``rec``: its parsed line, if marked) belongs to; a
        restart boundary, a new token or the marker inside another message may start one."""
        cur = self.current
        if entry.boundary and cur.parity_lines:
            cur = self._start_new(entry.number)
        if isinstance(rec, ParityLine):
            if not rec.hidden:  # a message journalctl left out fails the invocation it falls in
                cur = self._place(rec.token, entry.number)
        elif rec is None and MARKER in entry.message and not cur.token_fixed:
            loose = loose_token(entry.message)
            if loose is not None:
                cur = self._place(loose, entry.number)  # the marker inside another message, first of its invocation
        return cur

    def _late(self, cur: Invocation, entry: Entry) -> bool:
        """A well-formed parity line that changes nothing but the counts and will not be listed (one of the current
        invocation after its gate decided, or one the gate ignores once the ignored lines listed are full):
        counted by its verdict alone (``verdicts.line_verdict``, the rule ``GateState.feed`` applies), without a
        ParityLine. Most lines of a long journal come here. False: the full path must take it."""
        message = entry.message
        if entry.unreadable or entry.line_break:
            return False
        fields = fast_fields(message, entry.prefixed)  # (None for a line without the marker)
        if fields is None:
            return False
        _layer, _max_abs_diff, _mean, rel, rank, token, _extra = fields  # (one unpacking: cheaper than 3 lookups)
        if self.given is None and (token is None or token != cur.state.token or not cur.token_fixed):
            return False  # it may start another invocation: the full path places it
        verdict = line_verdict(cur.state, token, message, rank, rel)
        return cur.count_quietly(entry.number, verdict)

    def finish(self) -> tuple[Invocation, list[Invocation]]:
        for inv in [*self.done, self.current]:
            inv.conclude()
        return self.current, [*self.done, self.current]


def check_entries(
    entries: Iterable[Entry],
    settings: GateSettings,
    *,
    tp: int | None = None,
    token: str | None = None,
    reader: JournalReader | None = None,
) -> ParityCheck:
    """Judge journal entries as the deploy's gate would (see the module's docstring for which lines). ``reader``:
    the :class:`JournalReader` the entries come from (its text format, and the token it watches for)."""
    checker = _Checker(settings, tp, token, reader)
    feed, late = checker.feed, checker._late
    for entry in entries:
        cur = checker.current
        # The lane first (most lines of a long journal: after the decision, or ignored), then the full path.
        if entry.boundary or not late(cur, entry):
            feed(entry)
    judged, invocations = checker.finish()
    return ParityCheck(judged=judged, invocations=invocations, token_given=token is not None)


def check_journal(
    text: Iterable[str] | str,
    settings: GateSettings,
    *,
    tp: int | None = None,
    token: str | None = None,
    source: str = "input",
) -> ParityCheck:
    """Journal text (a string, split on ``\\n`` only, or its lines) -> the check. For tests and callers that hold
    the text; the CLI streams bytes through :class:`JournalReader` itself."""
    data = text if isinstance(text, str) else "\n".join(x.rstrip("\n") for x in text)
    reader = JournalReader(source)
    result = check_entries(reader.read([data.encode()]), settings, tp=tp, token=token, reader=reader)
    result.input_lines, result.unreadable, result.left_out = reader.lines, reader.unreadable, reader.left_out
    result.input_format = str(reader.format or InputFormat.TEXT)
    return result
