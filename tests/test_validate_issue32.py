"""Issue 32, second pass of `pdkit validate`: secrets that cannot work (class 3), model paths the
engines cannot read (class 5), one rule for what a decode's CUDA graphs must cover (class 6)."""

from __future__ import annotations

import pytest

from pdkit.cli import main
from pdkit.inventory.loader import load_with_problems
from tests.conftest import write_inventory
from tests.test_validate import _engine, assert_validate_refuses


def _errors(base_mutate, base, tmp_path, capsys):
    cluster, hosts = base
    base_mutate(cluster, hosts)
    inv = write_inventory(tmp_path, hosts, cluster)
    rc = main(["validate", str(inv)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err, inv


# ---------------------------------------------------------------------------------------------
# 6. one rule for what a decode's CUDA graphs must cover: validate and doctor agree

def _decode_shape(tp: int, dp: int = 1, attn_dp: int | None = None, max_bs: int = 32, target: int = 128):
    """gpu02's decode becomes TP tp x DP dp (or attention DP attn_dp) on GPUs 2.., capturing up to max_bs."""
    def mutate(c, h):
        c["target_concurrency"] = target
        node = h["gpu02"]["pdkit_node"]
        node["gpus"] = {**node["gpus"], "count": 8, "numa": [0, 0, 0, 0, 1, 1, 1, 1]}
        decode = _engine(h, "gpu02", 1)
        decode.update(gpus=list(range(2, 2 + tp * dp)), tp=tp, dp=dp, tuning={"cuda_graph_max_bs": max_bs})
        if attn_dp is not None:
            decode["attn_dp"] = attn_dp
        # gpu01's decode covers any target here: only gpu02's shape is under test
        _engine(h, "gpu01", 1)["tuning"] = {"cuda_graph_max_bs": target}
    return mutate


GRAPH_CASES = [
    ("graph-tp2-dp2-below-per-rank", _decode_shape(2, dp=2, max_bs=63), "gpu02", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "over 2 DP ranks: 64 per rank"),
    ("graph-tp4-attn-dp4-below-per-rank", _decode_shape(4, attn_dp=4, max_bs=24, target=100), "gpu02", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "set cuda_graph_max_bs >= 25"),
    ("graph-tp2-no-dp-below-target", _decode_shape(2, max_bs=64), "gpu02", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "set cuda_graph_max_bs >= 128"),
    ("graph-tp1-dp3-rounds-up", _decode_shape(1, dp=3, max_bs=33, target=100), "gpu02", "pdkit_node.engines[1].tuning.cuda_graph_max_bs", "set cuda_graph_max_bs >= 34"),
]


@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_graph_cover_below_the_per_rank_target_is_an_error(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


# (tp, dp, attn_dp, target, what one graph must cover)
SHAPES = [(2, 2, None, 128, 64), (4, 1, 4, 100, 25), (2, 1, None, 128, 128), (1, 3, None, 100, 34), (4, 1, 2, 9, 5)]


@pytest.mark.parametrize("tp,dp,attn_dp,target,required", SHAPES)
def test_validate_and_doctor_use_one_rule(tp, dp, attn_dp, target, required, base, tmp_path, capsys):
    """At exactly the per-rank size validate passes and doctor plans the same size; one below,
    validate refuses and doctor's graph_buckets fails on an engine that captured it."""
    from dataclasses import replace

    from pdkit.doctor.checks_graphs import check_graph_buckets
    from pdkit.doctor.collection import engine_plans
    from pdkit.doctor.model import PASS
    from pdkit.spec import decode_graph_required_bs
    from tests.test_doctor import observe

    cluster, hosts = base
    _decode_shape(tp, dp=dp, attn_dp=attn_dp, max_bs=required, target=target)(cluster, hosts)
    spec, problems = load_with_problems(write_inventory(tmp_path, hosts, cluster))
    assert spec is not None, problems
    assert not [p for p in problems if p.field.endswith("cuda_graph_max_bs")], problems
    (plan,) = [p for p in engine_plans(spec) if p.host == "gpu02" and p.engine == "decode"]
    (_, decode), = [(h, e) for h, e in spec.engines() if h.name == "gpu02" and e.role == "decode"]
    assert plan.required_bs == decode_graph_required_bs(decode, target) == required
    assert plan.graph_max_bs == required

    # the same figure is the doctor's verdict on an engine that captured `required` (or one less)
    obs = observe("lab_base", "decode")  # captured up to 64
    obs.plan = replace(obs.plan, required_bs=plan.required_bs, graph_max_bs=plan.graph_max_bs)
    verdict = check_graph_buckets(obs)
    assert (verdict.status == PASS) == (64 >= required), verdict

    # one below the per-rank size: validate refuses, naming the size doctor would ask for
    rc, err, _ = _errors(_decode_shape(tp, dp=dp, attn_dp=attn_dp, max_bs=required - 1, target=target), (cluster, hosts), tmp_path, capsys)
    assert rc == 2 and f"set cuda_graph_max_bs >= {required}" in err, err


def test_required_bs_is_none_for_prefill_and_without_a_target():
    from pdkit.spec import Engine, decode_graph_required_bs

    prefill = Engine(name="p", role="prefill", gpus=(0, 1), tp=1, dp=2, port=30000)
    decode = Engine(name="d", role="decode", gpus=(0, 1), tp=1, dp=2, port=30001)
    assert decode_graph_required_bs(prefill, 128) is None
    assert decode_graph_required_bs(decode, None) is None
    assert decode_graph_required_bs(decode, 128) == 64
    assert decode_graph_required_bs(decode, 127) == 64


# ---------------------------------------------------------------------------------------------
# 3. secrets that cannot work: every entry of the secrets table, blank or unusable by its reader

def _secret(**values):
    def mutate(c, h):
        c.setdefault("secrets", {}).update(values)
        if "router_api_key" in values:
            h["gpu01"]["pdkit_router"].pop("auth", None)  # the base says auth: none (no key); a key means api_key
    return mutate


SECRET_CASES = [
    ("hf-token-empty", _secret(hf_token=""), "gpu01", "pdkit_cluster.secrets.hf_token", "environment variable the inventory reads it from is unset"),
    ("hf-token-whitespace", _secret(hf_token="  \n"), "gpu01", "pdkit_cluster.secrets.hf_token", "set the token (hf_...), or remove hf_token"),
    ("hf-token-two-lines", _secret(hf_token="hf_abc\nhf_def"), "gpu01", "pdkit_cluster.secrets.hf_token", "alone on one line"),
    ("router-key-empty", _secret(router_api_key=""), "gpu01", "pdkit_cluster.secrets.router_api_key", "the router refuses to start with it"),
    ("router-key-blank", _secret(router_api_key="   "), "gpu01", "pdkit_cluster.secrets.router_api_key", "openssl rand -hex 32"),
    ("router-key-trailing-newline", _secret(router_api_key="k3y\n"), "gpu01", "pdkit_cluster.secrets.router_api_key", "a line break (\\n)"),
    ("router-key-leading-space", _secret(router_api_key=" k3y"), "gpu01", "pdkit_cluster.secrets.router_api_key", "remove the whitespace"),
    ("router-key-non-ascii", _secret(router_api_key="schlüssel"), "gpu01", "pdkit_cluster.secrets.router_api_key", "printable ASCII"),
    ("router-key-on-sglang-router", lambda c, h: _secret(router_api_key="k3y")(c, h) or h["gpu01"]["pdkit_router"].update(package="sglang-router"), "gpu01", "pdkit_cluster.secrets.router_api_key", "use package smg"),
    ("receiver-credential-empty", _secret(alert_receivers={"oncall": ""}), "mon01", "pdkit_cluster.secrets.alert_receivers.oncall", "set the credential, or remove it"),
    ("receiver-credential-blank", _secret(alert_receivers={"oncall": " \n"}), "mon01", "pdkit_cluster.secrets.alert_receivers.oncall", "environment variable"),
    ("receiver-credential-two-lines", _secret(alert_receivers={"oncall": "tok\nen"}), "mon01", "pdkit_cluster.secrets.alert_receivers.oncall", "alone on one line"),
    # issue 46: credential shapes (a scheme the reader adds itself, a URL where a key belongs and the reverse)
    ("webhook-token-with-its-scheme", _secret(alert_receivers={"oncall": "Bearer t0k3n"}), "mon01", "pdkit_cluster.secrets.alert_receivers.oncall", "'Bearer Bearer ...'"),
    ("webhook-token-is-a-url", _secret(alert_receivers={"oncall": "https://hooks.example.net/x"}), "mon01", "pdkit_cluster.secrets.alert_receivers.oncall", "is a URL, but Alertmanager sends it as the receiver's key"),
    ("slack-credential-is-a-token", lambda c, h: _receiver(h, {"name": "chat", "kind": "slack"}) or _secret(alert_receivers={"chat": "xoxb-123-456"})(c, h), "mon01", "pdkit_cluster.secrets.alert_receivers.chat", "https://hooks.slack.com/services/"),
    ("opsgenie-key-with-its-scheme", lambda c, h: _receiver(h, {"name": "genie", "kind": "opsgenie"}) or _secret(alert_receivers={"genie": "GenieKey abc-123"})(c, h), "mon01", "pdkit_cluster.secrets.alert_receivers.genie", "'GenieKey GenieKey ...'"),
    ("pagerduty-key-is-a-url", lambda c, h: _receiver(h, {"name": "pd", "kind": "pagerduty"}) or _secret(alert_receivers={"pd": "https://events.pagerduty.com/v2/enqueue"})(c, h), "mon01", "pdkit_cluster.secrets.alert_receivers.pd", "give the key itself"),
    ("hf-token-with-its-scheme", _secret(hf_token="Bearer hf_AbC123"), "gpu01", "pdkit_cluster.secrets.hf_token", "'Bearer Bearer ...'"),
]


def _receiver(hosts, receiver):
    """One more receiver on mon01's Alertmanager."""
    alerting = hosts["mon01"]["pdkit_monitoring"]["alerting"]
    alerting["receivers"] = [*alerting["receivers"], receiver]


@pytest.mark.parametrize("case", SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
def test_a_secret_that_cannot_work_is_an_error_naming_it(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)




def test_secret_problems_never_print_the_value(base, tmp_path, capsys):
    cluster, hosts = base
    cluster["secrets"] = {"hf_token": "hf_sEcReTvAlUe\n", "router_api_key": " sEcReTvAlUe", "alert_receivers": {"oncall": "sEcReTvAlUe\nx"}}
    rc, err, _ = _errors(lambda c, h: None, (cluster, hosts), tmp_path, capsys)
    assert rc == 2
    assert "sEcReTvAlUe" not in err
    assert {f for f in ("hf_token", "router_api_key", "alert_receivers.oncall") if f"pdkit_cluster.secrets.{f}" in err} == {"hf_token", "router_api_key", "alert_receivers.oncall"}, err


@pytest.mark.parametrize("values", [
    {"hf_token": "hf_AbC123"},
    {"router_api_key": "a key with inner spaces\tand a tab"},  # smg 1.13.0 matches it (measured)
    {"alert_receivers": {"oncall": " tok \n"}},  # Alertmanager 0.25 strips a credential file's surrounding whitespace (measured)
    {"alert_receivers": {"oncall": "t0k3n", "chat": "https://hooks.slack.com/services/T0/B0/x"}},
    {"alert_receivers": {"oncall": "bearerish-token-without-a-space", "genie": "abc-123"}},
], ids=["hf-token", "router-key-inner-space", "receiver-credential-trailing-newline", "slack-url-and-plain-token",
        "keys-that-only-look-like-a-scheme"])
def test_secrets_their_readers_take_are_valid(values, base, tmp_path, capsys):
    def mutate(c, h):
        if "chat" in values.get("alert_receivers", {}):
            _receiver(h, {"name": "chat", "kind": "slack"})
        if "genie" in values.get("alert_receivers", {}):
            _receiver(h, {"name": "genie", "kind": "opsgenie"})
        _secret(**values)(c, h)
    rc, err, _ = _errors(mutate, base, tmp_path, capsys)
    assert rc == 0 and "secrets" not in err, err


# ---------------------------------------------------------------------------------------------
# 5. model paths the engines cannot read: the paths the unit's sandbox hides (validate)

MODEL_PATH_CASES = [
    ("model-under-home", lambda c, h: c["model"].update(path="/home/ml/models/Qwen3-8B"), "gpu01", "pdkit_cluster.model.path", "e.g. /models/Qwen3-8B"),
    ("model-under-root", lambda c, h: c["model"].update(path="/root/llama"), "gpu02", "pdkit_cluster.model.path", "ProtectHome=yes"),
    ("engine-model-in-tmp", lambda c, h: _engine(h, "gpu02", 0).update(model={"path": "/tmp/m"}) or _engine(h, "gpu02", 1).update(model={"path": "/tmp/m"}), "gpu02", "pdkit_node.engines[1].model.path", "is under /tmp"),
    ("tokenizer-under-home", lambda c, h: c["model"].update(tokenizer_path="/home/ml/tok"), "gpu01", "pdkit_cluster.model.tokenizer_path", "SGLang would not find the tokenizer"),
    ("draft-in-var-tmp", lambda c, h: _engine(h, "gpu01", 1).update(tuning={"speculative": {"algorithm": "EAGLE3", "draft_model_path": "/var/tmp/draft"}}), "gpu01", "pdkit_node.engines[1].tuning.speculative.draft_model_path", "move it outside /home, /root, /run/user, /tmp, /var/tmp"),
    ("draft-on-the-decode-layer-under-run-user", lambda c, h: c["tuning"]["decode"].update(speculative={"algorithm": "EAGLE3", "draft_model_path": "/run/user/1000/draft"}), "gpu01", "pdkit_cluster.tuning.decode.speculative.draft_model_path", "is under /run/user"),
]


@pytest.mark.parametrize("case", MODEL_PATH_CASES, ids=[c[0] for c in MODEL_PATH_CASES])
def test_a_model_path_the_engine_sandbox_hides_is_an_error(case, base, tmp_path, capsys):
    assert_validate_refuses(case, base, tmp_path, capsys)


@pytest.mark.parametrize("path", ["/models/m", "/opt/models/m", "/srv/home/m", "/homework/m", "meta-llama/Llama-3.1-8B-Instruct"])
def test_model_paths_the_engines_see_are_valid(path, base, tmp_path, capsys):
    rc, err, _ = _errors(lambda c, h: c["model"].update(path=path), base, tmp_path, capsys)
    assert rc == 0, err


def test_the_sim_engine_never_reads_the_model_so_a_home_path_is_valid(base, tmp_path, capsys):
    rc, err, _ = _errors(lambda c, h: c.update(engine="sim") or c["model"].update(path="/home/ml/m"), base, tmp_path, capsys)
    assert rc == 0, err


@pytest.mark.parametrize("cases", [SECRET_CASES, MODEL_PATH_CASES, GRAPH_CASES], ids=["secrets", "model-paths", "graph-cover"])
def test_each_class_of_issue_32_has_three_cases(cases):
    assert len({c[0] for c in cases}) >= 3 and all(c[2] and c[3] and c[4] for c in cases)
