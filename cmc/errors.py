"""One error hierarchy for every stage: user errors carry a position or a parameter name."""

from __future__ import annotations

from dataclasses import dataclass

MAX_ECHO = 64  # characters of a name or token quoted in a message (names have at most 64)
MAX_MESSAGE = 1000  # characters of one message: a backstop for anything echoed untruncated
MAX_SHOWN_LINE = 160  # characters of the source line shown above the caret


def echo(text: str, limit: int = MAX_ECHO) -> str:
    """Input text as a message may quote it: at most `limit` characters, so a 1 MB name or
    line is never printed in full (every valid name fits the default)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"



@dataclass(frozen=True)
class Span:
    """A region of a .mask file; lines and columns are 1-based, end_col exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    source: str = ""  # full text of the file, for the caret picture

    def source_line(self) -> str:
        lines = self.source.splitlines()
        return lines[self.line - 1] if 0 < self.line <= len(lines) else ""


class CmcError(Exception):
    """Base of every error cmc reports to a user (the CLI prints these without a traceback)."""

    exit_code = 1

    def format(self) -> str:
        return f"error: {self}"


@dataclass(frozen=True)
class Diagnostic:
    message: str
    span: Span | None
    severity: str = "error"  # "error" or "warning"

    def format(self) -> str:
        if self.span is None:
            return f"{self.severity}: {self.message}"
        s = self.span
        head = f"{s.file}:{s.line}:{s.col}: {self.severity}: {echo(self.message, MAX_MESSAGE)}"
        text = s.source_line()
        if not text:
            return head
        width = (s.end_col - s.col) if s.end_line == s.line and s.end_col > s.col else 1
        width = max(1, min(width, len(text) - s.col + 1)) if len(text) >= s.col else 1
        col = s.col - 1
        if len(text) > MAX_SHOWN_LINE:  # a window around the caret, with ... on cut sides
            start = max(0, min(col - MAX_SHOWN_LINE // 4, len(text) - MAX_SHOWN_LINE))
            cut_left, cut_right = start > 0, start + MAX_SHOWN_LINE < len(text)
            text = ("..." if cut_left else "") + text[start:start + MAX_SHOWN_LINE] + \
                ("..." if cut_right else "")
            col = col - start + (3 if cut_left else 0)
            width = max(1, min(width, len(text) - col - (3 if cut_right else 0)))
        caret = " " * col + "^" * width
        return f"{head}\n  {text}\n  {caret}"


class MaskError(CmcError):
    """One or more problems in a .mask file, each with its position."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic):
        self.diagnostics = [diagnostics] if isinstance(diagnostics, Diagnostic) else list(diagnostics)
        super().__init__("\n".join(d.format() for d in self.diagnostics))

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)

    @classmethod
    def at(cls, message: str, span: Span | None) -> MaskError:
        return cls(Diagnostic(message, span))


class UsageError(CmcError):
    """Bad command-line usage (exit code 2)."""

    exit_code = 2


class BuildError(CmcError):
    """NVRTC rejected generated source: carries the log and a command that reproduces it."""

    def __init__(self, message: str, log: str = "", source_path: str = "", repro: str = ""):
        self.log, self.source_path, self.repro = log, source_path, repro
        super().__init__(message)

    def format(self) -> str:
        parts = [f"error: {self}"]
        if self.log:
            parts.append("NVRTC log:\n" + self.log.rstrip())
        if self.source_path:
            parts.append(f"generated source: {self.source_path}")
        if self.repro:
            parts.append(f"reproduce with: {self.repro}")
        return "\n".join(parts)


class ArtifactError(CmcError):
    """A compiled artifact is missing, stale, corrupt or does not fit the device."""


class ParamError(CmcError, ValueError):
    """A run-time argument broke a rule; names the parameter and the rule."""

    def __init__(self, param: str, rule: str):
        self.param, self.rule = param, rule
        super().__init__(f"{param}: {rule}")
