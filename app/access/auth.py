"""Who may act on a studio: viewers browse every run; launching, stopping, resuming and deleting need a login
when the operator asks for one.

- No `--auth` and no Hugging Face OAuth (one person on 127.0.0.1): no login; everyone is the local user, who may do
  everything.
- `--auth user:password[:admin]` (repeatable) or `--auth-file FILE` (one such line per user): password users,
  through the studio's own sign-in box (Gradio's `launch(auth=...)` would lock out viewers too). A signed-in page
  keeps a token in the browser (`gr.BrowserState`); an API client gets one from `/login` and sends it in the
  `x-a2po-token` header (or `Authorization: Bearer ...`).
- On a Space with `hf_oauth: true` in its header: Gradio's "Sign in with Hugging Face" button; the user is
  `hf:<username>`; `--admin NAME` (repeatable) names admins. Only there (`oauth_problem`): off a Space, Gradio
  mocks the login with the machine's own Hugging Face profile, so every visitor would be that user.

A user stops, resumes or deletes only their own runs unless admin; each run records who launched it. Tokens are
HMAC-signed with a secret kept in the data folder, so they survive restarts, and expire after `TOKEN_DAYS`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_DAYS = 7
TOKEN_HEADER = "x-a2po-token"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class User:
    name: str
    admin: bool = False


LOCAL_USER = User("local", admin=True)


def _hash(password: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 100_000)


def profile_of(request: Any) -> dict[str, Any] | None:
    """The Hugging Face OAuth profile in a request's session (set by Gradio's login route), or None."""
    try:
        session = request.session
    except Exception:  # noqa: BLE001 - no session middleware: OAuth is off
        return None
    info = (session or {}).get("oauth_info") or {}
    if info.get("expires_at") is not None and info["expires_at"] < time.time():
        return None
    return info.get("userinfo")


# What Gradio's real OAuth routes read (`gradio.oauth._add_oauth_routes`); a Space with `hf_oauth: true` sets them.
OAUTH_VARIABLES = ("OAUTH_CLIENT_ID", "OAUTH_CLIENT_SECRET", "OAUTH_SCOPES", "OPENID_PROVIDER_URL")


def on_a_space(environ: Mapping[str, str] | None = None) -> bool:
    """True on a Hugging Face Space, by Gradio's own rule (`gradio.utils.get_space`), which decides between its real
    OAuth routes and the mocked ones."""
    env = os.environ if environ is None else environ
    return env.get("SYSTEM") == "spaces" and env.get("SPACE_ID") is not None


def oauth_problem(oauth: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """Why Hugging Face sign-in may not be turned on here, or None. Off a Space, Gradio's login button signs every
    visitor in as the Hugging Face account this machine is logged in to (`gradio.oauth._add_mocked_oauth_routes`):
    every visitor would act as that user, an admin if `--admin` names it."""
    if not oauth:
        return None
    env = os.environ if environ is None else environ
    if not on_a_space(env):
        return ("Hugging Face sign-in (--hf-oauth, on by itself when OAUTH_CLIENT_ID is set) works only on a Hugging "
                "Face Space: elsewhere Gradio signs every visitor in as this machine's own Hugging Face account. "
                "Give users passwords with --auth-file FILE (lines USER:PASSWORD[:admin]) instead, and unset "
                "OAUTH_CLIENT_ID if it is set.")
    missing = [name for name in OAUTH_VARIABLES if not env.get(name)]
    if missing:
        return (f"--hf-oauth on this Space needs `hf_oauth: true` in the Space's README header, which sets "
                f"{', '.join(OAUTH_VARIABLES)} ({', '.join(missing)} missing).")
    if not all(importlib.util.find_spec(name) for name in ("authlib", "itsdangerous")):
        return "--hf-oauth needs Gradio's OAuth extras: pip install 'gradio[oauth]'."
    return None


class Auth:
    """The studio's users and what each may do (see the module docstring)."""

    def __init__(self, users: Mapping[str, tuple[str, bool]] | None = None, *, secret: bytes | None = None,
                 oauth: bool = False, admins: Iterable[str] = (), public: bool = False) -> None:
        self._passwords: dict[str, tuple[bytes, bytes, bool]] = {}
        for name, (password, admin) in (users or {}).items():
            salt = os.urandom(16)
            self._passwords[name] = (salt, _hash(password, salt), admin)
        self.oauth = oauth
        self.public = public  # a public studio never lets anonymous visitors act, even with no login configured
        self.admins = set(admins)
        self._secret = secret or secrets.token_bytes(32)

    @classmethod
    def from_options(cls, auth: Iterable[str] = (), auth_file: str | os.PathLike[str] | None = None, *,
                     data_dir: Path, oauth: bool = False, admins: Iterable[str] = (), public: bool = False) -> Auth:
        """From `--auth user:password[:admin]` values and an `--auth-file` of such lines (blank lines and lines
        starting with # ignored). The token secret lives in `<data_dir>/auth_secret` (created, mode 0600)."""
        lines = list(auth)
        if auth_file:
            lines += [line.strip() for line in Path(auth_file).read_text().splitlines()
                      if line.strip() and not line.strip().startswith("#")]
        users: dict[str, tuple[str, bool]] = {}
        for line in lines:
            name, sep, rest = line.partition(":")
            password, _, role = rest.rpartition(":") if rest.endswith(":admin") else (rest, "", "")
            if not name or not sep or not password:
                raise ValueError(f"Bad user {line.split(':')[0]!r}: write user:password or user:password:admin.")
            users[name] = (password, role == "admin")
        secret = None
        if users or oauth or public:
            path = Path(data_dir) / "auth_secret"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, secrets.token_bytes(32))
                os.close(fd)
            secret = path.read_bytes()
        return cls(users, secret=secret, oauth=oauth, admins=admins, public=public)

    @property
    def required(self) -> bool:
        """True when acting needs a login (password users or OAuth configured, or a public studio)."""
        return bool(self._passwords) or self.oauth or self.public

    @property
    def passwords(self) -> bool:
        return bool(self._passwords)

    # ------------------------------------------------------------------ tokens

    def derived_secret(self, purpose: str) -> str:
        """A stable secret for `purpose` (e.g. encrypting the browser's copy of a token), from the studio's."""
        return hmac.new(self._secret, purpose.encode(), hashlib.sha256).hexdigest()

    def login(self, name: str, password: str) -> str | None:
        """A token for a correct user name and password, else None (same time either way)."""
        salt, expected, _ = self._passwords.get(name, (b"\0" * 16, b"", False))
        ok = hmac.compare_digest(_hash(password or "", salt), expected) and name in self._passwords
        return self.token_for(name) if ok else None

    def token_for(self, name: str) -> str:
        payload = f"{name}|{int(time.time()) + TOKEN_DAYS * 86400}".encode()
        signature = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(payload).decode() + "." + base64.urlsafe_b64encode(signature).decode()

    def user_from_token(self, token: str | None) -> User | None:
        if not token or "." not in token:
            return None
        try:
            encoded, signature = token.split(".", 1)
            payload = base64.urlsafe_b64decode(encoded)
            valid = hmac.compare_digest(base64.urlsafe_b64decode(signature),
                                        hmac.new(self._secret, payload, hashlib.sha256).digest())
            name, expiry = payload.decode().rsplit("|", 1)
        except (ValueError, UnicodeDecodeError):
            return None
        if not valid or int(expiry) < time.time():
            return None
        if name.startswith(HF_PREFIX):
            return User(name, admin=name[len(HF_PREFIX):] in self.admins) if self.oauth else None
        if name not in self._passwords:
            return None  # a user removed since the token was issued
        return User(name, admin=self._passwords[name][2] or name in self.admins)

    def user_from_profile(self, profile: Any) -> User | None:
        """The user of a Hugging Face OAuth profile (Gradio's `gr.OAuthProfile`), when OAuth is on."""
        if profile is None or not self.oauth:
            return None
        username = getattr(profile, "username", None)
        if username is None and isinstance(profile, Mapping):
            username = profile.get("preferred_username")
        if not username:
            return None
        return User(HF_PREFIX + username, admin=username in self.admins)

    def identify(self, token: str | None = None, request: Any = None, profile: Any = None) -> User | None:
        """Who is asking: the local user when no login is required; else the user of a token (given, or in the
        request's `x-a2po-token` / `Authorization: Bearer` header) or of an OAuth profile; None: anonymous."""
        if not self.required:
            return LOCAL_USER
        headers = getattr(request, "headers", None) or {}
        bearer = headers.get("authorization", "") if hasattr(headers, "get") else ""
        candidates = [token, headers.get(TOKEN_HEADER) if hasattr(headers, "get") else None,
                      bearer[7:] if bearer.lower().startswith("bearer ") else None]
        for candidate in candidates:
            user = self.user_from_token(candidate)
            if user is not None:
                return user
        return self.user_from_profile(profile if profile is not None else profile_of(request))

    # ------------------------------------------------------------------ rules

    def owner_of(self, user: User | None) -> str | None:
        """What a run launched by `user` records as its owner (None when no login exists)."""
        return user.name if user is not None and self.required else None

    def can_launch(self, user: User | None) -> str | None:
        """Why `user` may not launch runs, or None."""
        if user is not None:
            return None
        if not self.passwords and not self.oauth:
            return ("This public studio has no sign-in configured, so it is read-only: browse the runs. (Its operator "
                    "enables launching with --auth, or with hf_oauth: true in the Space's README header.)")
        how = "sign in (the box at the top of the page, or /login for the API)" if self.passwords else \
            "sign in with Hugging Face (the button at the top of the page)"
        return f"Launching runs needs a login on this studio: {how}. Anyone may browse the runs."

    def can_manage(self, user: User | None, run: Mapping[str, Any]) -> str | None:
        """Why `user` may not stop, resume or delete `run`, or None."""
        problem = self.can_launch(user)
        if problem:
            return problem.replace("Launching runs", "Stopping, resuming or deleting a run")
        if user.admin or not self.required or run.get("owner") == user.name:
            return None
        return (f"Run #{run['id']} was launched by {run.get('owner') or 'someone else'}: only they (or an admin) may "
                "stop, resume or delete it.")
