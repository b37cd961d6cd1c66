"""The sign-in box at the top of every page, shown only when the operator asked for logins (`app.access.auth`).

Viewers browse everything without signing in. A password user signs in here; the page keeps the token in the
browser (`gr.BrowserState`, encrypted with a secret of the studio), so a reload stays signed in, and passes it
to every action. On a Space with Hugging Face OAuth, Gradio's own button signs in instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app.access.gate import Services

VISITOR = "Browsing as a visitor: sign in to launch, stop, resume or delete runs."


@dataclass
class Login:
    token: gr.BrowserState
    status: gr.Markdown | None


def build_login(services: Services) -> Login:
    """The token the pages pass to their actions, and (when logins exist) the sign-in row."""
    auth = services.auth
    secret = auth.derived_secret("browser-state") if auth.required else None
    token = gr.BrowserState(None, storage_key="a2po-studio-token", secret=secret)
    if not auth.required:
        return Login(token, None)
    with gr.Row(elem_id="login-row", equal_height=True):
        status = gr.Markdown(VISITOR, elem_id="login-status")
        if auth.passwords:
            user = gr.Textbox(label="User", scale=1, min_width=120, elem_id="login-user")
            password = gr.Textbox(label="Password", type="password", scale=1, min_width=120,
                                  elem_id="login-password")
            sign_in = gr.Button("Sign in", size="sm", scale=0, min_width=90, elem_id="login-button")
            sign_out = gr.Button("Sign out", size="sm", scale=0, min_width=90, elem_id="logout-button")
        if auth.oauth:
            gr.LoginButton(size="sm", scale=0)

    if auth.passwords:
        def attempt(name: str, secret_word: str):
            value = auth.login((name or "").strip(), secret_word or "")
            if value is None:
                return gr.skip(), "❌ Wrong user name or password.", ""
            return value, f"Signed in as **{name.strip()}**.", ""

        sign_in.click(attempt, [user, password], [token, status, password], api_visibility="private")
        password.submit(attempt, [user, password], [token, status, password], api_visibility="private")
        sign_out.click(lambda: (None, VISITOR), None, [token, status], api_visibility="private")
    token.change(_describer(services), token, status, api_visibility="private")
    return Login(token, status)


def _describer(services: Services):
    def describe(value: str | None, request: gr.Request) -> str:
        user = services.auth.identify(token=value, request=request)
        return VISITOR if user is None else f"Signed in as **{user.name}**{' (admin)' if user.admin else ''}."
    return describe


def show_status(demo: gr.Blocks, services: Services, login: Login) -> None:
    """Show who is signed in when a page loads (the token comes back from the browser)."""
    if login.status is not None:
        demo.load(_describer(services), login.token, login.status, api_visibility="private")
