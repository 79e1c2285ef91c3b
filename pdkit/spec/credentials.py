"""Secrets and alert receivers checked against what reads them: receivers and routes that name
nothing, credentials missing or unused, values the router, Alertmanager or the hub client cannot take."""

from __future__ import annotations

from pdkit.spec.alerting import NULL_RECEIVER, RECEIVER_KINDS, receiver_needs_credential
from pdkit.spec.cluster import ClusterSpec, HostSpec, Problem
from pdkit.spec.models import Secrets

__all__ = [
    "alerting_problems", "router_auth_problems", "secret_problems",
]


def alerting_problems(host: HostSpec, secrets: Secrets) -> list[Problem]:
    """pdkit_monitoring.alerting against itself and the secrets table: names, routes, credentials."""
    assert host.monitoring is not None
    alerting = host.monitoring.alerting
    out: list[Problem] = []
    at = "pdkit_monitoring.alerting"
    names: dict[str, int] = {}
    for i, receiver in enumerate(alerting.receivers):
        if receiver.name in names:
            out.append(Problem(host.name, f"{at}.receivers[{i}].name",
                               f"receiver name {receiver.name!r} is already used by receivers[{names[receiver.name]}]; "
                               "names must be unique"))
        names.setdefault(receiver.name, i)
    if not alerting.receivers:
        out.append(Problem(host.name, f"{at}.receivers",
                           f"no receiver: Alertmanager sends every alert to {NULL_RECEIVER!r}, so alerts reach no one "
                           "(they show only on its and Prometheus' alert pages); add a receiver (README, \"Alerts: "
                           "adding a receiver\")", "warning"))
    valid = ", ".join(names) or f"none (no receiver is declared: add one to {at}.receivers)"
    named = [(f"{at}.{field}", getattr(alerting, field))
             for field in ("default_receiver", "critical_receiver", "warning_receiver")]
    named += [(f"{at}.routes[{i}].receiver", route.receiver) for i, route in enumerate(alerting.routes)]
    for field, name in named:
        if name is not None and name not in names:
            out.append(Problem(host.name, field, f"{name!r} is not a receiver; valid: {valid}"))
    creds = secrets.alert_receivers
    secret_at = "pdkit_cluster.secrets.alert_receivers"
    for i, receiver in enumerate(alerting.receivers):
        need = receiver_needs_credential(receiver)
        what = RECEIVER_KINDS[receiver.kind].credential_is
        if need and receiver.name not in creds:
            out.append(Problem(host.name, f"{secret_at}.{receiver.name}",
                               f"receiver {receiver.name!r} ({at}.receivers[{i}], {receiver.kind}) needs its "
                               f"credential, {what}: set {secret_at} = {{{receiver.name!r}: ...}} (never inline in the "
                               "receiver)"))
        if need is False and receiver.name in creds:
            out.append(Problem(host.name, f"{secret_at}.{receiver.name}",
                               f"receiver {receiver.name!r} (email) has no auth_username, so its SMTP password would "
                               "never be sent: set auth_username, or remove the credential"))
    kinds = {r.name: r.kind for r in alerting.receivers}
    for name, secret in creds.items():
        if name in kinds and (why := credential_shape_problem(kinds[name], secret.get_secret_value())):
            out.append(Problem(host.name, f"{secret_at}.{name}", f"receiver {name!r} ({kinds[name]}): {why}"))
    for name in creds:
        if name not in names:
            out.append(Problem(host.name, f"{secret_at}.{name}",
                               f"no receiver is named {name!r}, so this credential is unused; receivers: {valid}",
                               "warning"))
    return out


# The scheme each reader puts in front of a credential itself (issue 46: a value pasted with it is sent
# twice, "Bearer Bearer ...", and refused): Alertmanager 0.25 sends webhook and webex credentials as
# http_config.authorization type Bearer (pdkit/monitoring/alertmanager.py), Opsgenie's as
# "GenieKey <key>" (notify/opsgenie); huggingface_hub sends HF_TOKEN as "Bearer <token>".
SCHEME_ADDED = {"webhook": "Bearer", "webex": "Bearer", "opsgenie": "GenieKey"}
# the receiver kinds whose credential is a URL (Alertmanager's slack api_url_file); every other one is a
# key or token, where a URL means the wrong thing was pasted
URL_CREDENTIALS = frozenset({"slack"})


def credential_shape_problem(kind: str, value: str) -> str | None:
    """Pure: why a receiver credential of KIND has the wrong shape (never quoting it), or None."""
    text = value.strip()
    scheme = SCHEME_ADDED.get(kind)
    if scheme and text.lower().startswith(scheme.lower() + " "):
        return (f"starts with '{scheme} ', which Alertmanager puts in front of it itself (it would send "
                f"'{scheme} {scheme} ...', refused): give the credential alone")
    is_url = "://" in text
    if kind in URL_CREDENTIALS and not text.startswith("https://"):
        return ("is not an https:// URL, but Alertmanager reads it as the Slack incoming-webhook URL "
                "(https://hooks.slack.com/services/...): give that URL (a token goes nowhere)")
    if kind not in URL_CREDENTIALS and is_url:
        return ("is a URL, but Alertmanager sends it as the receiver's key or token: give the key itself (the "
                "receiver's endpoint is its own field, or Alertmanager's default)")
    return None


# What each secret can hold, from what reads it (issue 32 class 3). Measured against the pinned
# programs (never printing a value back: a Problem names the secret, never its value):
# - smg 1.13.0 (the router): an empty --api-key stops it at start ("an empty credential would
#   switch authentication on with a key nothing can present"), and pdkit's router launcher
#   (templates/router-launch.py.j2) exits on an empty key; a key with leading or trailing
#   whitespace is answered 401 however a client sends it (the launcher strips the key file, HTTP
#   trims the header), as is a key with a line break or any non-ASCII character (sent as UTF-8 or
#   Latin-1); spaces and tabs inside the key work. pdkit's own clients (Python's http.client)
#   refuse a header value with a line break ("Invalid header value").
# - Alertmanager 0.25 (receiver credentials, read from *_file): strips the file's surrounding
#   whitespace, so an empty or blank credential is sent as nothing ("Authorization: Bearer"), and
#   a line break inside fails every notification ("net/http: invalid header field value").
# - HF_TOKEN: an empty one authenticates nothing; requests (in the engines' environment) refuses a
#   header value with a line break ("InvalidHeader").
def _blank(value: str) -> bool:
    return not value.strip()


def _control_chars(value: str) -> list[str]:
    """The control characters in VALUE, named (never the value itself); a tab is allowed."""
    names = {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)", "\x00": "a NUL byte"}
    return sorted({names.get(c, f"control character U+{ord(c):04X}") for c in value if (ord(c) < 0x20 and c != "\t")
                   or ord(c) == 0x7F})


def secret_problems(spec: ClusterSpec) -> list[Problem]:
    """Secrets whose value cannot work where pdkit hands it: blank ones, and ones the reader
    (the chosen router package, Alertmanager, the engines' hub client) cannot take."""
    out: list[Problem] = []
    secrets = spec.cluster.secrets
    at = "pdkit_cluster.secrets"
    blank_hint = "an empty value usually means the environment variable the inventory reads it from is unset"
    fallback = spec.hosts[0].name if spec.hosts else "<inventory>"
    if secrets.hf_token is not None:
        host = spec.gpu_hosts[0].name if spec.gpu_hosts else fallback
        value = secrets.hf_token.get_secret_value()
        if _blank(value):
            out.append(Problem(host, f"{at}.hf_token",
                               "is empty or only whitespace, so the engines would reach the hub without a token "
                               f"({blank_hint}): set the token (hf_...), or remove hf_token"))
        elif value.strip().lower().startswith("bearer "):
            out.append(Problem(host, f"{at}.hf_token",
                               "starts with 'Bearer ', which the hub client puts in front of the token itself (it "
                               "would send 'Bearer Bearer ...', refused): give the token alone, e.g. hf_AbC123..."))
        elif bad := _control_chars(value):
            out.append(Problem(host, f"{at}.hf_token",
                               f"contains {', '.join(bad)}: the token goes into an HTTP header, which cannot carry it "
                               "(requests refuses it); give the token alone on one line, e.g. hf_AbC123..."))
    if secrets.router_api_key is not None:
        hosts = spec.router_hosts
        smg = [h for h in hosts if spec.router_release(h)[0] == "smg"]
        host = (smg or hosts)[0].name if hosts else fallback
        value = secrets.router_api_key.get_secret_value()
        valid = "valid: printable ASCII without surrounding whitespace, e.g. the output of `openssl rand -hex 32`"
        if _blank(value):
            out.append(Problem(host, f"{at}.router_api_key",
                               "is empty or only whitespace: the router refuses to start with it (smg: 'an empty "
                               "credential would switch authentication on with a key nothing can present'; pdkit's "
                               f"launcher: 'credential ... is empty') ({blank_hint}); set a key, or remove "
                               f"router_api_key; {valid}"))
        elif bad := _control_chars(value):
            out.append(Problem(host, f"{at}.router_api_key",
                               f"contains {', '.join(bad)}: no client can present it (an HTTP header cannot carry it, "
                               f"and smg answers 401); {valid}"))
        elif value != value.strip():
            out.append(Problem(host, f"{at}.router_api_key",
                               "has leading or trailing whitespace: smg answers 401 to such a key however a client "
                               "sends it (HTTP trims the header; pdkit's launcher strips the key file): remove the "
                               f"whitespace; {valid}"))
        elif not value.isascii():
            out.append(Problem(host, f"{at}.router_api_key",
                               "contains non-ASCII characters: smg never matches such a key (401 whether it is sent as "
                               f"UTF-8 or Latin-1) and pdkit's clients cannot send most of them; {valid}"))
    mon = spec.monitoring_hosts[0].name if spec.monitoring_hosts else fallback
    for name, secret in secrets.alert_receivers.items():
        value = secret.get_secret_value()
        field = f"{at}.alert_receivers.{name}"
        if _blank(value):
            out.append(Problem(mon, field, f"is empty or only whitespace: Alertmanager would send receiver {name!r} no "
                               f"credential (a service that needs one refuses every notification) ({blank_hint}); set "
                               "the credential, or remove it"))
        elif bad := _control_chars(value.strip()):
            out.append(Problem(mon, field, f"contains {', '.join(bad)} inside the value: Alertmanager fails every "
                               "notification with it ('invalid header field value'); give the credential alone on one "
                               "line"))
    return out


# Who may call the router (issue 46): a key, or nobody asked. An inventory that reads the key from the
# environment (os.environ.get("PDKIT_ROUTER_KEY")) gets None when the variable is unset, and the router then
# serves anyone who reaches its port; so no key must be said: pdkit_router.auth "none".
def router_auth_problems(spec: ClusterSpec) -> list[Problem]:
    out: list[Problem] = []
    key = spec.cluster.secrets.router_api_key
    secret = "pdkit_cluster.secrets.router_api_key"
    for host in spec.router_hosts:
        router = host.router
        assert router is not None
        package, version = spec.router_release(host)
        smg = package == "smg"
        with_key = (f"auth: 'api_key' with {secret} set (smg only)" if smg else
                    f"a key needs package smg ({package} {version} takes one only on its command line)")
        if router.auth is None and key is None:
            out.append(Problem(host.name, "pdkit_router.auth",
                               f"the router gets no API key ({secret} is unset: if the inventory reads it from an "
                               "environment variable, that variable is unset here), so it serves anyone who reaches "
                               f"port {router.port}; valid: {with_key}, or auth: 'none' to run without one on "
                               "purpose", "warning"))
        elif router.auth == "api_key" and key is None:
            out.append(Problem(host.name, secret,
                               f"pdkit_router.auth is 'api_key' but {secret} is unset (the environment variable that "
                               "should hold it is probably unset where pdkit runs): set the key, e.g. "
                               "os.environ[\"PDKIT_ROUTER_KEY\"] so that an unset variable stops the inventory, or "
                               "auth: 'none'"))
        elif router.auth == "api_key" and not smg:
            out.append(Problem(host.name, "pdkit_router.auth",
                               f"'api_key' with {package} {version}, which takes its key only on its command line "
                               "(it would leak): valid: package smg, or auth: 'none'"))
        elif router.auth == "none" and key is not None:
            out.append(Problem(host.name, "pdkit_router.auth",
                               f"'none' but {secret} is set, and every router and pdkit client uses that key: valid: "
                               f"auth: 'api_key' (or unset) with the key, or auth: 'none' with {secret} removed"))
    return out
