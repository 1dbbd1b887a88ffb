"""Loop selection and ``overlap-sim advise``: the rules table evaluated for the launch commands
the issue lists, checked against what SGLang's source does in each release."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sim.cli import main
from sim.engines.sglang.rules.launch_args import parse_launch_args, rules_table
from sim.engines.sglang.rules.loop_rules import admission_policy, advise, retraction_policy, setting_faults
from sim.engines.sglang.rules.specifiers import parse_specifiers, version_in
from sim.engines.sglang.server import SETTINGS
from sim.errors import ScenarioError, UserInputError
from sim.scenario import load_scenario


def ids(hits):
    return [h.id for h in hits]


def test_default_cuda_runs_two_stream_overlap():
    adv = advise(["--model-path", "Qwen/Qwen3-8B"], "cuda")
    assert (adv.loop, adv.setting, adv.overlap) == ("event_loop_overlap", "overlap", True)
    assert adv.disabled_by == ()
    assert adv.config.version == "0.5.22"
    assert any("--model-path Qwen/Qwen3-8B: the model served" in n for n in adv.notes)  # (not "passed over")
    assert adv.config.model == "Qwen/Qwen3-8B"
    assert "overlap_retract_v0522" in ids(adv.hazards)


def test_disable_overlap_schedule_selects_normal():
    adv = advise(["--model-path", "X", "--disable-overlap-schedule"], "cuda")
    assert (adv.loop, adv.setting, adv.overlap) == ("event_loop_normal", "normal", False)
    assert ids(adv.disabled_by) == ["user_flag"]
    assert "normal_less_tested" in ids(adv.hazards)


def test_pipeline_parallel_turns_overlap_off_and_selects_pp_loop():
    adv = advise(["--model-path", "X", "--pp-size", "2"], "cuda")
    assert adv.loop == "event_loop_pp" and adv.setting is None and not adv.overlap
    assert ids(adv.disabled_by) == ["pipeline_parallel"]
    assert "not_simulated" in ids(adv.hazards)
    assert advise(["--pipeline-parallel-size=4"], "cuda").loop == "event_loop_pp"


@pytest.mark.parametrize("version,env,algo,overlap,rule", [
    ("0.5.10", [], "EAGLE", False, "speculative_without_spec_v2"),       # spec v1: overlap off
    ("0.5.10", ["SGLANG_ENABLE_SPEC_V2=1"], "EAGLE", True, None),       # spec v2 keeps it
    ("0.5.10", [], "NGRAM", False, "ngram_speculative"),
    ("0.5.4", ["--enable-beta-spec"], "EAGLE", True, None),             # beta spec, EAGLE only
    ("0.5.4", ["--enable-beta-spec"], "EAGLE3", False, "speculative_without_beta_spec"),
    ("0.5.3", [], "EAGLE", False, "speculative_v1"),
    ("0.5.22", [], "EAGLE", True, None),                                # v2 is the only worker
])
def test_speculative_decoding_with_and_without_spec_v2(version, env, algo, overlap, rule):
    adv = advise([*env, "--speculative-algorithm", algo], "cuda", version)
    assert adv.overlap is overlap
    assert ids(adv.disabled_by) == ([rule] if rule else [])


def test_speculative_decoding_on_cpu_disables_overlap():
    adv = advise(["--speculative-algorithm", "NGRAM"], "cpu", "0.5.22")
    assert not adv.overlap and ids(adv.disabled_by) == ["speculative_on_cpu"]


def test_mlx_default_runs_the_mlx_chain():
    adv = advise(["--model-path", "X"], "mlx")
    assert (adv.loop, adv.setting, adv.overlap) == ("event_loop_overlap_mlx", "overlap_mlx", True)
    assert adv.faults() == ()


def test_mlx_with_overlap_disabled_has_the_relay_fault():
    adv = advise(["--disable-overlap-schedule"], "mlx", "0.5.22")
    assert (adv.loop, adv.setting) == ("event_loop_normal", "normal")
    fault, = adv.faults()
    assert fault.id == "mlx_normal_futuremap_device_mismatch" and fault.severity == "fault"
    assert fault.sim["die_on_batch_min_reqs"] == 2
    assert "seed document" in fault.source


def test_mps_without_mlx_disables_overlap_and_env_token_turns_mlx_on():
    adv = advise([], "mps")
    assert adv.loop == "event_loop_normal" and ids(adv.disabled_by) == ["mps_without_mlx"]
    adv = advise(["SGLANG_USE_MLX=1", "python", "-m", "sglang.launch_server", "--model-path", "X"], "mps")
    assert adv.config.platform == "mlx" and adv.setting == "overlap_mlx"
    assert adv.notes == ("--model-path X: the model served, which the costs stand for (the profile's or the "
                         "scenario's; no effect on the event loop)",)
    # before the MLX overlap loop existed, MPS turned overlap off whatever the backend
    assert ids(advise([], "mlx", "0.5.10").disabled_by) == ["mps_backend"]


def test_dllm_pdmux_disaggregation():
    assert ids(advise(["--dllm-algorithm", "LowConfidence"]).disabled_by) == ["diffusion_llm"]
    adv = advise(["--enable-pdmux"])
    assert adv.loop == "event_loop_pdmux" and "pdmux_needs_overlap_off" in ids(adv.hazards)
    assert advise(["--disaggregation-mode", "decode"]).loop == "event_loop_overlap_disagg_decode"
    assert advise(["--disaggregation-mode", "prefill", "--disable-overlap-schedule"]).loop == \
        "event_loop_normal_disagg_prefill"


def test_thread_era_selects_thread_overlap():
    adv = advise([], "cuda", "0.5.3")
    assert adv.setting == "thread_overlap" and "TpModelWorkerClient" in adv.selected_by.text
    assert "thread_overlap_gil" in ids(adv.hazards)
    assert advise([], "cuda", "0.5.4").setting == "overlap"


def test_flags_the_rules_do_not_read_are_passed_over_with_a_note():
    adv = advise(["--log-level", "info", "--random-seed", "7", "stray", "--tp", "2", "--mem-fraction-static=0.8"])
    assert adv.overlap and adv.setting is None  # TP on a card: the loop is overlap; the simulator refuses it
    assert adv.config.fields["tp_size"] == 2
    assert advise(["--tp", "2"], "cpu").setting == "overlap"  # modelled on the CPU server (a profile at TP 2)
    notes = " | ".join(adv.notes)
    for text in ("--log-level info", "--random-seed 7", "'stray' passed over", "--mem-fraction-static", ):
        assert text in notes
    with pytest.raises(UserInputError, match="unrecognized arguments"):  # as sglang.launch_server's parser
        advise(["--foo", "bar"])


def test_newer_release_gets_a_note_and_bad_input_raises():
    assert any("newer than any checked" in n for n in advise([], "cuda", "0.6.1").notes)
    with pytest.raises(UserInputError, match="integer"):
        advise(["--pp-size", "two"])
    with pytest.raises(UserInputError, match="value after"):
        advise(["--page-size"])
    with pytest.raises(UserInputError, match="release"):
        advise([], "cuda", "latest")
    with pytest.raises(UserInputError, match="one of"):
        advise([], "rocm")


def test_rules_table_is_well_formed():
    table = rules_table()
    rows = table["rules"]
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["kind"] in {"disable_overlap", "loop", "hazard", "retraction", "admission"}, r["id"]
        SpecifierSet(r["versions"])  # parses as PEP 440
        parse_specifiers(r["versions"])  # and as the plain-release ranges the simulator matches
        assert r.get("source"), r["id"]
        if r["kind"] == "loop":
            assert r["setting"] in (*SETTINGS, None)
    loops = [r for r in rows if r["kind"] == "loop"]
    assert loops[-1]["id"] == "select_normal" and loops[-1]["when"] == {}  # a fallback always matches
    assert {f["flag"] for f in table["flags"]} >= {"--disable-overlap-schedule", "--pp-size", "--speculative-algorithm"}


def test_retraction_policy_by_release_and_setting_faults():
    assert [retraction_policy(v) for v in ("0.5.4", "0.5.12", "0.5.22", None)] == \
        ["naive", "v0.5.10", "v0.5.22", "v0.5.22"]
    assert [admission_policy(v) for v in ("0.5.4", "0.5.10", "0.5.22", "0.5.23", None)] == \
        ["v0.5.4", "v0.5.4", "v0.5.22", "v0.5.22", "v0.5.22"]
    assert ids(setting_faults("mlx", "normal", "0.5.22")) == ["mlx_normal_futuremap_device_mismatch"]
    assert setting_faults("mlx", "normal", "0.5.10") == ()
    assert setting_faults("mlx", "overlap_mlx") == () and setting_faults("cuda", "normal") == ()


def test_parse_maps_flags_onto_scenario_fields():
    cfg = parse_launch_args(["--page-size", "64", "--max-total-tokens", "2176", "--schedule-conservativeness", "0.5",
                             "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1"])
    assert cfg.server == {"page_size": 64, "kv_pool_tokens": 2176, "init_new_token_ratio": pytest.approx(0.35),
                          "disable_consecutive_prefill_overlap": True}


def test_sglang_use_mlx_off_the_mps_device_is_said_to_be_passed_over():
    said = "SGLANG_USE_MLX is set, but the device is cuda: MLX runs on Apple's MPS device only"
    assert parse_launch_args(["SGLANG_USE_MLX=1", "--model-path", "X"]).platform == "cuda"
    assert any(n.startswith(said) for n in parse_launch_args(["SGLANG_USE_MLX=1", "--model-path", "X"]).notes)
    assert not any("MLX runs" in n for n in parse_launch_args(["SGLANG_USE_MLX=0", "--model-path", "X"]).notes)
    assert parse_launch_args(["SGLANG_USE_MLX=1"], platform="mps").platform == "mlx"  # read there: no note
    assert not any("MLX runs" in n for n in parse_launch_args(["SGLANG_USE_MLX=1"], platform="mps").notes)


# --- scenarios with launch_args ------------------------------------------------------------


def test_scenario_settings_follow_launch_args():
    s = load_scenario({"name": "x", "server": {"device": "mlx", "launch_args": ["--disable-overlap-schedule",
                                                                                 "--page-size", "16"]}})
    assert s.server.settings == ["normal"] and s.server.page_size == 16
    # explicit settings win (a comparison), and launch_args still fill the other fields
    s = load_scenario({"name": "x", "server": {"device": "mlx", "settings": ["overlap_mlx", "normal"],
                                               "launch_args": ["--disable-overlap-schedule"]}})
    assert s.server.settings == ["overlap_mlx", "normal"]


def test_scenario_launch_args_rederived_after_override():
    s = load_scenario({"name": "x", "server": {"launch_args": ["--disable-overlap-schedule"]}})
    assert s.server.settings == ["normal"]
    assert s.with_overrides(["server.launch_args=[]"]).server.settings == ["overlap"]
    assert load_scenario(s, ["server.version=0.5.3", "server.launch_args=[]"]).server.settings == ["thread_overlap"]


def test_scenario_version_sets_retraction_unless_given():
    assert load_scenario({"name": "x", "server": {"version": "0.5.6"}}).server.retraction == "naive"
    assert load_scenario({"name": "x", "server": {"version": "0.5.6", "retraction": "v0.5.22"}}).server.retraction == "v0.5.22"
    assert load_scenario({"name": "x"}).server.retraction == "v0.5.22"


@pytest.mark.parametrize("server,expected", [
    ({"launch_args": ["--pp-size", "2"]}, "pipeline parallelism, which is not modelled"),
    ({"launch_args": ["--page-size", "64"], "page_size": 16}, r"server\.page_size: 16 here, but launch_args give 64"),
    ({"launch_args": ["--pp-size", "x"]}, "integer"),
    ({"version": "newest"}, "release"),
    ({"version": 0.5}, r"server\.version: a release as text .* put it in quotes"),  # YAML's `version: 0.5`
    # the server's own device and version beside launch_args: named as those fields, not as a launch argument
    ({"launch_args": ["--page-size", "64"], "device": "tpu"}, r"server\.device: expected one of cuda, mlx, mps, cpu \(got 'tpu'\)"),
    ({"launch_args": ["--page-size", "64"], "device": None}, r"server\.device: expected one of .* \(got None\)"),
    ({"launch_args": ["--page-size", "64"], "version": "abc"}, r"server\.version: expected an SGLang release"),
])
def test_scenario_launch_args_errors_name_the_field(server, expected):
    with pytest.raises(ScenarioError, match=expected) as err:
        load_scenario({"name": "x", "server": server})
    assert "server" in str(err.value)


@pytest.mark.parametrize("depth", [100, 1000, 5000])
def test_a_launch_argument_nested_too_deep_to_print_is_one_short_line(tmp_path, depth):
    """Lists nested deep in a scenario file's launch_args are refused in one short line: where the
    YAML parser reads them, the value is shown to a few levels (repr would recurse past Python's
    limit); where it cannot (libyaml refuses deep nesting from PyYAML 6.0.4 on, and PyYAML's own
    parser recurses), the file is not valid YAML, nested too deep."""
    path = tmp_path / "deep.yaml"
    path.write_text("name: x\nserver: {launch_args: [" + "[" * depth + "]" * depth + "]}\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert re.search(r"server\.launch_args\.0: expected a string.*got \[\[\[|not valid YAML \(YAML: lists or mappings "
                     r"nested too deep to read\)", str(err.value)), str(err.value)
    assert len(str(err.value)) < 300


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_advise_json(capsys):
    assert main(["advise", "--device", "mlx", "--json", "--", "--model-path", "X", "--disable-overlap-schedule"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["loop"] == "event_loop_normal" and out["overlap"] is False
    assert out["hazards"][0]["id"] == "mlx_normal_futuremap_device_mismatch"


def test_cli_advise_text_and_errors(capsys):
    assert main(["advise", "--", "--pp-size", "2", "--log-level", "info"]) == 0
    text = capsys.readouterr().out
    assert "event_loop_pp" in text and "pipeline_parallel" in text and "--log-level" in text
    assert main(["advise", "--version", "x.y", "--", "--model-path", "X"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--version" in err[0]


# --- the table's release ranges, matched without packaging.specifiers --------------------------

EDGE_VERSIONS = ["0.5.3", "0.5.4.dev0", "0.5.4a1", "0.5.4rc1", "0.5.4", "0.5.4+cpu", "0.5.4.post1",
                 "0.5.4.post1.dev2", "0.5.9", "0.5.10rc0", "0.5.10", "0.5.16.post3", "0.5.17.dev1", "0.5.17rc2",
                 "0.5.17", "0.5.17+cu128", "0.5.17.post1", "0.5.22", "0.5.23", "0.5.23+cpu", "0.6", "1!0.1"]


def test_every_range_of_the_table_matches_as_pep_440_does():
    for spec in sorted({r["versions"] for r in rules_table()["rules"]}):
        for text in EDGE_VERSIONS:
            v = Version(text)
            assert version_in(spec, v) == SpecifierSet(spec).contains(v, prereleases=True), (spec, text)


def test_hand_checked_edges():
    # PEP 440: <V leaves out V's pre-releases, >V its post-releases and local versions
    assert not version_in("<0.5.17", Version("0.5.17rc2"))
    assert version_in("<0.5.17", Version("0.5.16.post3"))
    assert not version_in(">0.5.4", Version("0.5.4.post1"))
    assert not version_in(">0.5.4", Version("0.5.4+cpu"))
    assert version_in(">=0.5.4", Version("0.5.4+cpu")) and version_in("==0.5.4", Version("0.5.4+cpu"))
    assert version_in("", Version("0.0.1")) and version_in(" , ", Version("9"))


@pytest.mark.parametrize("spec", ["~=0.5", "0.5.4", ">=0.5.*", "===0.5.4", ">=0.5.4rc1", "<0.5.4.post1",
                                  ">=", ">=0.5.4+cpu", "=>0.5.4"])
def test_unsupported_ranges_are_refused(spec):
    with pytest.raises(ValueError, match="unsupported version range"):
        parse_specifiers(spec)


_releases = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(lambda r: ".".join(map(str, r)))


@st.composite
def _versions(draw):
    text = draw(_releases)
    label = draw(st.sampled_from(["", "a", "b", "rc", ".post", ".dev"]))
    if label:
        text += f"{label}{draw(st.integers(0, 2))}"
    if draw(st.booleans()):
        text += f"+{draw(st.sampled_from(['cpu', 'cu128', '1']))}"
    return Version(text)


@given(ops=st.lists(st.tuples(st.sampled_from([">=", "<=", ">", "<", "==", "!="]), _releases), max_size=3),
       version=_versions())
@settings(max_examples=400, deadline=None)
def test_generated_ranges_match_as_pep_440_does(ops, version):
    spec = ",".join(f"{op}{bound}" for op, bound in ops)
    assert version_in(spec, version) == SpecifierSet(spec).contains(version, prereleases=True)


def test_on_the_cpu_engine_advise_does_not_describe_cuda_streams(run_cli):
    code, out, _ = run_cli(["advise", "--device", "cpu", "--", "--model-path", "M"])
    flat = " ".join(out.split())
    assert code == 0 and "scheduler's thread" in flat and "CUDA streams" not in flat


def test_sizes_the_server_section_refuses_leave_no_simulator_setting():
    """A pool that is not a whole number of pages (SGLang rounds it down and starts; the
    simulator's server section refuses it) is not modelled: no setting, a note naming the field,
    as vLLM's advise does for its sizes."""
    adv = advise(["--page-size", "4096", "--max-total-tokens", "16"])
    assert adv.setting is None and adv.overlap
    assert adv.notes[0].startswith("not modelled by the simulator (SGLang may start): kv_pool_tokens")
    assert advise(["--page-size", "16", "--max-total-tokens", "4096"]).setting == "overlap"
