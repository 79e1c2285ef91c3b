"""Where Alertmanager sends alerts: the receiver kinds pdkit renders (RECEIVER_KINDS), receivers,
routes and the pdkit_monitoring.alerting section."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pdkit.spec.fields import MAX_INTERVAL_S, MAX_TIMEOUT_S, NAME_PATTERN, Frozen, at_most

__all__ = [
    "LABEL_NAME", "NULL_RECEIVER", "RECEIVER_FIELDS", "RECEIVER_KINDS", "Alerting", "AlertRoute", "Receiver",
    "receiver_needs_credential", "ReceiverKind",
]


@dataclass(frozen=True)
class ReceiverKind:
    """What a receiver kind needs: its own fields, and its credential (pdkit_cluster.secrets.alert_receivers)."""

    # Alertmanager's list under a receiver (`webhook_configs`, ...)
    configs_key: str
    # Receiver fields it must have / may have (beside name, kind, send_resolved)
    required: tuple[str, ...]
    optional: tuple[str, ...]
    # "required"; "optional"; or "with auth_username" (email: SMTP auth only when a user is set)
    credential: str
    # what the credential is, for errors and the docs
    credential_is: str


# The receiver kinds pdkit renders: the integrations Alertmanager 0.25 (Debian bookworm's) has
# natively AND can read their credential from a file (`*_file`, or http_config's
# `credentials_file`), so the secret sits only in a mode-0600 file and never in alertmanager.yml.
# 0.25 also has telegram, discord, pushover, sns and wechat, but reads their token only inline
# (checked with amtool 0.25: bot_token_file, webhook_url_file, token_file are unknown fields);
# reach those through a webhook bridge. The one table validation, rendering and docs read.
RECEIVER_KINDS: dict[str, ReceiverKind] = {
    "webhook": ReceiverKind("webhook_configs", ("url",), (), "optional",
                            "a bearer token (sent as `Authorization: Bearer`)"),
    "email": ReceiverKind("email_configs", ("to", "from_address", "smarthost"), ("auth_username", "require_tls"),
                          "with auth_username", "the SMTP password of auth_username"),
    "slack": ReceiverKind("slack_configs", (), ("channel",), "required", "the Slack incoming-webhook URL"),
    "pagerduty": ReceiverKind("pagerduty_configs", (), (), "required",
                              "the PagerDuty Events API v2 routing (integration) key"),
    "opsgenie": ReceiverKind("opsgenie_configs", (), (), "required", "the Opsgenie API key"),
    "victorops": ReceiverKind("victorops_configs", ("routing_key",), (), "required",
                              "the VictorOps (Splunk On-Call) API key"),
    "webex": ReceiverKind("webex_configs", ("room_id",), (), "required", "the Webex bot's access token"),
}
RECEIVER_FIELDS = ("url", "to", "from_address", "smarthost", "auth_username", "require_tls", "channel", "routing_key",
                   "room_id")
# the receiver every alert goes to when none is configured: Alertmanager needs one; it notifies no one
NULL_RECEIVER = "pdkit-null"
# label names a route may match on (Prometheus' label name syntax)
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
# one email address as Go's net/mail takes it: addr@domain, or a display name and <addr@domain>
_EMAIL_ADDRESS = re.compile(r"(?:[^<>@,;\n]*<)?[^\s<>@,;]+@[^\s<>@,;]+>?")
# a group_by entry: a label name, or Alertmanager's "..." (every label)
GROUP_BY_LABEL = r"^(\.\.\.|[a-zA-Z_][a-zA-Z0-9_]*)$"


class Receiver(Frozen):
    """One place alerts go (pdkit_monitoring.alerting.receivers[]): a kind and its fields; its credential is in the secrets table."""

    # the receiver's name: routes and pdkit_cluster.secrets.alert_receivers name it
    name: str = Field(pattern=NAME_PATTERN)
    # webhook, email, slack, pagerduty, opsgenie, victorops or webex (see RECEIVER_KINDS)
    kind: Literal["webhook", "email", "slack", "pagerduty", "opsgenie", "victorops", "webex"]
    # webhook: the URL Alertmanager POSTs to (http or https; Alertmanager 0.25 has no url_file, so no
    # secret in it: use the credential)
    url: str | None = None
    # email: recipient address(es), comma separated
    to: str | None = None
    # email: sender address
    from_address: str | None = None
    # email: the SMTP server, host:port
    smarthost: str | None = None
    # email: SMTP user (its password is the credential)
    auth_username: str | None = None
    # email: STARTTLS required (Alertmanager's default: true)
    require_tls: bool | None = None
    # slack: channel (#name) or user (@name); unset: the webhook's own channel
    channel: str | None = None
    # victorops: the routing key
    routing_key: str | None = None
    # webex: the room id
    room_id: str | None = None
    # also notify when the alert resolves
    send_resolved: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL (Alertmanager's webhook POSTs to one)")
        return url

    @field_validator("to", "from_address")
    @classmethod
    def _addresses(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Alertmanager parses `to` with Go's mail.ParseAddressList (commas between addresses; a
        # semicolon, Outlook's separator, fails every notification) and `from` as one address
        if value is None:
            return value
        parts = [p.strip() for p in value.split(",")] if info.field_name == "to" else [value.strip()]
        bad = [p for p in parts if not _EMAIL_ADDRESS.fullmatch(p)]
        if bad:
            many = "addresses separated by commas, each " if info.field_name == "to" else ""
            raise ValueError(f"{bad[0]!r} is not an email address Alertmanager can parse; valid: {many}"
                             "name@example.com or Name <name@example.com>" + (" (a semicolon does not separate "
                                                                            "addresses there)" if ";" in value else ""))
        return value

    @field_validator("smarthost")
    @classmethod
    def _host_port(cls, smarthost: str | None) -> str | None:
        if smarthost is not None and not re.fullmatch(r"[A-Za-z0-9_.\[\]:-]+:\d{1,5}", smarthost):
            raise ValueError(f"{smarthost!r} is not host:port (e.g. smtp.example.com:587)")
        return smarthost

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Receiver:
        kind = RECEIVER_KINDS[self.kind]
        missing = [f for f in kind.required if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} receiver needs "
                             f"{', '.join(missing)} (required for {self.kind}: {', '.join(kind.required)}; optional: "
                             f"{', '.join(kind.optional) or 'none'})")
        stray = [f for f in RECEIVER_FIELDS if getattr(self, f) is not None and f not in kind.required + kind.optional]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not a {self.kind} receiver's "
                             f"field; valid for {self.kind}: "
                             f"{', '.join(kind.required + kind.optional) or 'none besides name, kind, send_resolved'}")
        return self


def receiver_needs_credential(receiver: Receiver) -> bool | None:
    """True: must have a credential; None: may; False: must not (email without auth_username)."""
    rule = RECEIVER_KINDS[receiver.kind].credential
    if rule == "required":
        return True
    if rule == "with auth_username":
        return receiver.auth_username is not None or False
    return None


class AlertRoute(Frozen):
    """A route of pdkit_monitoring.alerting.routes: alerts whose labels equal MATCH go to RECEIVER."""

    # label: value, all must equal (e.g. {"role": "decode"} or {"alertname": "PdkitEngineWedged"})
    match: dict[str, str] = Field(min_length=1)
    # the receiver's name
    receiver: str

    @field_validator("match")
    @classmethod
    def _label_names(cls, match: dict[str, str]) -> dict[str, str]:
        for label in match:
            if not re.fullmatch(LABEL_NAME, label):
                raise ValueError(f"{label!r} is not a label name (letters, digits, _; not starting with a digit)")
        return match


class Alerting(Frozen):
    """`pdkit_monitoring.alerting`: where Alertmanager sends alerts (docs/monitoring.md, "Alertmanager")."""

    # where alerts go: each a kind (webhook, email, slack, pagerduty, opsgenie, victorops, webex) and its
    # fields; none: alerts reach no one
    receivers: tuple[Receiver, ...] = ()
    # severity=critical alerts (pages) go here; unset: default_receiver
    critical_receiver: str | None = None
    # severity=warning alerts go here; unset: default_receiver
    warning_receiver: str | None = None
    # whatever no other route takes; unset: the first receiver
    default_receiver: str | None = None
    # routes tried before the severity routes, first match wins (e.g. {"match": {"role":
    # "decode"}, "receiver": "decode-team"})
    routes: tuple[AlertRoute, ...] = ()
    # one notification per group: per alert per node, so a node's engines wedging together page once;
    # ["..."] alone: every label (no grouping), [] one group for everything (Alertmanager's own forms)
    group_by: tuple[Annotated[str, Field(pattern=GROUP_BY_LABEL)], ...] = ("cluster", "alertname", "node")
    # how long a new group waits for more alerts before its first notification (Alertmanager's default)
    group_wait_s: Annotated[int, Field(ge=1), at_most(MAX_INTERVAL_S, "wait in seconds")] = 30
    # how long before a group's next notification about new or resolved alerts (Alertmanager's default)
    group_interval_s: Annotated[int, Field(ge=1), at_most(MAX_TIMEOUT_S, "interval in seconds")] = 300
    # how long before a still-firing group is sent again (Alertmanager's default: 4 h)
    repeat_interval_s: Annotated[int, Field(ge=1), at_most(7 * MAX_TIMEOUT_S, "interval in seconds")] = 14400

    @model_validator(mode="after")
    def _wildcard_alone(self) -> Alerting:
        # Alertmanager refuses '...' beside other labels (config.go: "cannot have wildcard group_by (`...`)
        # and other other labels at the same time")
        if "..." in self.group_by and len(self.group_by) > 1:
            raise ValueError(f"group_by {list(self.group_by)}: '...' (group by every label) stands alone; valid: "
                             "['...'], or a list of label names")
        return self

    @model_validator(mode="after")
    def _repeat_after_group(self) -> Alerting:
        if self.repeat_interval_s < self.group_interval_s:
            raise ValueError(f"repeat_interval_s ({self.repeat_interval_s}) is below group_interval_s "
                             f"({self.group_interval_s}): a group is only re-sent at a group interval; give "
                             "repeat_interval_s >= group_interval_s")
        return self

    def receiver_names(self) -> list[str]:
        return [r.name for r in self.receivers]

    def effective_default(self) -> str:
        """Where alerts no route takes go: default_receiver, the first receiver, or the null receiver."""
        return self.default_receiver or (self.receivers[0].name if self.receivers else NULL_RECEIVER)
