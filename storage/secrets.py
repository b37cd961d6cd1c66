"""What the studio keeps out of sight of its visitors.

- `scrub_secrets`: a run spec without its credentials, applied before a spec is stored (and by migration v1 to
  specs stored before that).
- `scrub_text`: the one scrubber of any text a process wrote that a visitor reads (a dead worker's log tail in a
  run's `error`, the Run page's log lines, a Ray job's output): without URLs that name a host or credentials (a
  database URL such as the worker command line's `--db postgresql+psycopg://ROLE@HOST/DB`, the Ray cluster's
  address), without IP addresses, and without the folders of absolute paths outside the studio's data folder.
  A log tail holds whatever the worker, the libraries and a reward function printed, so the scrubber reads it as
  text of unknown shape rather than trusting any one line's format.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Keys of a run spec that hold credentials: never kept in the database (anywhere in the spec, at any depth).
SECRET_KEY = re.compile(r"(^|_)(token|password|passwd|secret|api_?key|credentials?)($|_)", re.IGNORECASE)
HIDDEN = "***"

# scheme://rest, up to a space, a quote or a bracket (a URL in prose, a traceback or a repr).
_URL = re.compile(r"(?<![\w+.-])([A-Za-z][A-Za-z0-9+.-]{0,30})://([^\s'\"<>()\[\]{}`,;|\\]*)")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:.])\[?[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}\]?(?::\d{1,5})?(?![\w:])")
# An absolute POSIX path of at least two parts; not one inside a URL, a relative path or a word ("and/or", "it/s").
_PATH = re.compile(r"(?<![\w.~:/\\@*-])(/[\w.@+%~=-]+(?:/[\w.@+%~=,-]+)+/?)")
_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
# libpq's key=value connection strings, as psycopg's errors quote them.
_CONNINFO = re.compile(r"(?<![\w.-])(password|host|hostaddr)=(?:'[^']*'|\S+)", re.IGNORECASE)


def scrub_secrets(value: Any) -> Any:
    """`value` without the dict entries whose key names a credential (see `SECRET_KEY`), recursively."""
    if isinstance(value, dict):
        return {k: scrub_secrets(v) for k, v in value.items() if not SECRET_KEY.search(str(k))}
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def scrub_text(text: str | None, data_dir: str | Path | None = None, hidden: Iterable[str] = ()) -> str:
    """`text` as a visitor may read it (see the module docstring). `data_dir`: paths inside it are kept (a run's
    own files, which its spec and output folder name anyway); with none, every absolute path loses its folders.
    `hidden`: more strings never shown (the Ray cluster's address: its host and host:port go too)."""
    if not text:
        return text or ""
    words = set()
    for secret in hidden:
        if not secret:
            continue
        words.add(secret.rstrip("/"))
        parts = urlsplit(secret) if "://" in secret else None
        if parts is not None:
            words.update(x for x in (parts.netloc, parts.hostname) if x)
    words = {w for w in words if len(w) >= 3}
    if words:
        text = re.sub("|".join(map(re.escape, sorted(words, key=len, reverse=True))), HIDDEN, text,
                      flags=re.IGNORECASE)
    roots = _roots(data_dir)
    text = _CONNINFO.sub(lambda m: f"{m.group(1)}={HIDDEN}", text)
    text = _URL.sub(lambda m: _url(m.group(1), m.group(2), roots), text)
    text = _IPV4.sub(HIDDEN, text)
    # Three colons at least: a clock time (12:34:56) has two.
    text = _IPV6.sub(lambda m: HIDDEN if m.group(0).count(":") >= 3 else m.group(0), text)
    return _PATH.sub(lambda m: _path(m.group(1), roots), text)


def _roots(data_dir: str | Path | None) -> tuple[str, ...]:
    if data_dir is None:
        return ()
    given = Path(data_dir).expanduser()
    forms = {str(given.absolute())}
    try:
        forms.add(str(given.resolve()))
    except OSError:
        pass
    return tuple(f.rstrip("/") for f in forms if f.rstrip("/"))


def _url(scheme: str, rest: str, roots: tuple[str, ...]) -> str:
    """A URL kept only when it is a public web page's (http(s), a dotted host name, no port, no user); a file URL
    as its path; any other (a database's, Ray's, a bucket's) as `scheme://***`."""
    lowered = scheme.lower()
    if lowered == "file":
        stripped = rest.lstrip("/")
        return f"{scheme}://" + _PATH.sub(lambda m: _path(m.group(1), roots), "/" + stripped)
    if lowered in ("http", "https"):
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        host = netloc.rsplit("@", 1)[-1]
        public = ("@" not in netloc and ":" not in host and "." in host and host.lower() != "localhost"
                  and not re.fullmatch(r"[\d.]+", host) and HIDDEN not in host)
        if public:
            return f"{scheme}://{rest}"
    return f"{scheme}://{HIDDEN}"


def _path(path: str, roots: tuple[str, ...]) -> str:
    """A path inside the data folder as it is; another without its folders: an installed package's file from its
    package (`<site-packages>/torch/nn/module.py`, the same on every machine), anything else by its name alone."""
    bare = path.rstrip("/")
    if any(bare == root or bare.startswith(root + "/") for root in roots):
        return path
    packages = _PACKAGES.split(bare, maxsplit=1)
    if len(packages) == 2 and packages[1]:
        return f"<site-packages>/{packages[1]}"
    return f"…/{bare.rsplit('/', 1)[-1]}"
