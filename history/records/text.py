"""Proposal-controlled text as data: one cleaning when it enters, one escaping per medium when it is shown.

Everything a proposal writes — its title, rationale, category, the reasons and check details built from
its stderr, its file names — is untrusted: it has drawn a fake "merge on main" row on a terminal with
ANSI escapes, and hidden a report's checks and diff behind an unterminated ``<!--``. ``clean`` runs when a
proposal is created (control characters, bidirectional overrides and every invisible or format character removed, a
title kept on one line, everything capped); the renderers escape again for their medium (old records were
written before ``clean`` existed): ``clean`` again on a terminal (the commands' ``output.safe`` adds rich's
markup escaping), ``md_inline``
(Markdown and HTML punctuation backslash-escaped, one line), ``md_fence`` (a fenced block no line of the
text can close). Stdlib only: every layer may use it.
"""

from __future__ import annotations

import re
import unicodedata

TITLE_CHARS = 200
TEXT_CHARS = 8000
# what is dropped, by Unicode class: control characters (Cc: C0, DEL, C1; tab and newline are kept in multi-line
# text), format characters (Cf: tags U+E0000-E007F, zero-width spaces and joiners, the word joiner, bidirectional
# embeddings, overrides, isolates and marks, the BOM, the soft hyphen, interlinear annotations), private use (Co),
# surrogates (Cs), unassigned code points (Cn: none in the interpreter's Unicode database; a character newer than
# it is dropped too) and the line and paragraph separators (Zl, Zp)
_DROPPED = frozenset(("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"))
# ... and the other default-ignorable code points (Unicode's Default_Ignorable_Code_Point, outside those classes):
# variation selectors, the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free
# variation selectors, shorthand format controls — characters that render as nothing and can carry a hidden text
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U0001bca0-\U0001bca3\U000e0000-\U000e0fff]"
)
_SUSPECT = re.compile("[^\t\n\x20-\x7e]")  # what ``_visible`` looks at: every character but printable ASCII


def _visible(m: re.Match[str]) -> str:
    return "" if unicodedata.category(m.group()) in _DROPPED else m.group()


# an ANSI/VT escape sequence as a whole (CSI, OSC up to BEL or ST, two-character escapes): its parameters go too
_ESCAPE_SEQ = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]")
# what gives a character meaning inside a line of Markdown (emphasis, code, links, tables, HTML, entities, math);
# an underscore inside a word (ops_s) means nothing there and stays as it is
# on GitHub also "#12" (an issue reference: "Fixes #12" closes it on merge) and "@team" (a mention)
_MD_PUNCT = re.compile(r"([\\`*\[\]<&|~$#@]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")
# what GitHub links by itself in text, after Markdown (an escape does not stop it there): e-mail addresses, URLs and
# www. names (autolinks), mentions, issue references (#12, GH-12, owner/repo#12). Shown as code spans, where it
# links nothing; none of them holds a backtick or a "|", so the span cannot end early or split a table cell. ASCII
# word boundaries, as GitHub's own (a "_" or "é" before "http://" or "@" does not stop it linking)
_LIVE = re.compile(
    r"[A-Za-z0-9.+_-]+@[A-Za-z0-9_-]+\.[A-Za-z0-9.-]+|[A-Za-z][A-Za-z0-9+.-]*:(?://)?[^\s`|<>]*(?<=//)[^\s`|<>]*"
    r"|(?i:www)\.[^\s`|<>]+|(?<![A-Za-z0-9_])@[A-Za-z0-9][A-Za-z0-9_/.-]*"
    r"|(?:(?<![A-Za-z0-9_])[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)?#[0-9]+|(?i:GH)-[0-9]+"
    r"|(?i:mailto|xmpp):[^\s`|<>]+"
)
# what starts a block when it opens a line (a list item, a numbered list, a setext underline, a quote); a ">"
# anywhere else means nothing once every "<" is escaped
_MD_LEAD = re.compile(r"^([-+=>]|\d+(?=[.)]))")


def clean(text: object, limit: int = TEXT_CHARS, one_line: bool = False) -> str:
    """``text`` with escape sequences and unsafe characters removed, CRLF as LF, tabs as spaces when
    ``one_line`` (then every run of white space is one space), capped at ``limit`` characters (``…``)."""
    s = _ESCAPE_SEQ.sub("", str(text))
    s = s.replace("\r\n", "\n").replace("\r", "\n")
    s = _IGNORABLE.sub("", s)
    s = _SUSPECT.sub(_visible, s)
    s = " ".join(s.split()) if one_line else s.strip("\n")
    return s if len(s) <= limit else s[: max(limit - 1, 0)].rstrip() + "…"


def title(text: object) -> str:
    return clean(text, TITLE_CHARS, one_line=True)


def md_inline(text: object, limit: int = TEXT_CHARS) -> str:
    """One line of Markdown (a heading, a table cell, a list item): every character that Markdown or HTML
    gives a meaning inside a line is backslash-escaped, so nothing in it opens a comment, a tag, a link,
    a code span or a table cell, and it stays one line; what a forge would link by itself (a URL, a mention,
    an issue reference) is a code span."""
    s = clean(text, limit, one_line=True)
    spans: list[tuple[int, int]] = []
    for live in _LIVE.finditer(s):
        if spans and spans[-1][1] == live.start():  # adjacent: one span (two would render as one with backticks in it)
            spans[-1] = (spans[-1][0], live.end())
        else:
            spans.append((live.start(), live.end()))
    parts: list[str] = []
    last = 0
    for a, b in spans:
        parts += [_MD_PUNCT.sub(r"\\\1", s[last:a]), f"`{s[a:b]}`"]
        last = b
    s = "".join(parts) + _MD_PUNCT.sub(r"\\\1", s[last:])
    m = _MD_LEAD.match(s)
    if m:  # "1." -> "1\.", "- x" -> "\- x"
        s = s[: m.end()] + "\\" + s[m.end() :] if m.group(1)[0].isdigit() else "\\" + s
    return s


def md_fence(text: object, info: str = "", limit: int = TEXT_CHARS) -> str:
    """``text`` as a fenced code block whose fence is longer than any run of backticks in it: no line of
    the text can close it, and inside it nothing is markup."""
    s = clean(text, limit)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{s}\n{fence}"
