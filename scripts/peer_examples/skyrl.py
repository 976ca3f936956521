"""SkyRL's own example launch scripts (examples/**/*.sh), read as `--dialect skyrl` command lines.

extract(git_dir) reads every `.sh` under examples/ at the repository's HEAD, without running
it (scripts/peer_examples/shell.py expands its variables from the script's own defaults:
`: "${VAR:=default}"`, `VAR=${VAR:-default}`, plain assignments; `$HOME` is /home/user, the
script's arguments are empty). A script that only calls another one (`bash other.sh args
"$@"`) is read through that one, with those arguments.

Which scripts are counted (`selected`), in this order; the first rule that applies gives the
`why_not` of a script that is not:

1. the script runs a Python entry point (`uv run ... -m MODULE`, `python -m MODULE`, `uv run
   ... python FILE.py`), else "no Python entry point (setup, cluster or container script)";
2. that entry point trains with SkyRL's PPO loop: `skyrl.train.entrypoints.main_base` (or the
   older `skyrl_train.entrypoints.main_base`), or an example's own module that builds SkyRL's
   `BasePPOExp` (directly or through another example's experiment class) or a
   `RayPPOTrainer`. Not: SFT (`main_sft`), the Tinker API server, an inference server
   (`serve`, `inference_servers`), generation or evaluation only (`main_generate`,
   `main_harbor_generate`), data preparation or a retrieval server (any other module);
3. `trainer.strategy` is not `megatron` (SkyRL's default is fsdp), else "Megatron strategy";
4. `generator.inference_engine.backend` (or `generator.backend`) is not `sglang`, else "SGLang
   backend".

Everything else is an FSDP/vLLM training launch and is counted, whether or not hybrid can
read it. check() gives its key=value arguments to `python -m hybrid.main_ppo --dialect skyrl`'s
check, plus what the example's own entry module changes (ENTRY_MODULES below): an
environment the entry module registers (skyrl_gym.register(id, entry_point)) is named by that
entry point (`module.path:ClassName`, which hybrid imports the way skyrl-gym does); DAPO's
entry modules apply their soft overlong penalty with their defaults; the asynchronous ones
stand for SkyRL's asynchronous trainers; the full-context one for its dummy steps
(trainer.num_dummy_steps, 5 unless given); the on-policy distillation one for hybrid's
algorithm.on_policy_distillation=true; the verifiers one for hybrid's agent loop verifiers_env
(its environment.env_class read as agent.verifiers_env, ENTRY_RENAMES); entry modules that
replace SkyRL's generator or trainer with their own code are refused, naming what they replace.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path, PurePosixPath

from scripts.peer_examples import REFUSED, check_argv
from scripts.peer_examples.shell import commands

REPOSITORY = "NovaSky-AI/SkyRL"
HOME = "/home/user"
MAIN_BASE = ("skyrl.train.entrypoints.main_base", "skyrl_train.entrypoints.main_base")

# Entry modules that are not PPO training launches, by what they are.
NOT_TRAINING = (
    (re.compile(r"(^|\.)main_sft|sft_with_callbacks"), "SFT entry point"),
    (re.compile(r"^skyrl\.tinker\."), "Tinker API server"),
    (re.compile(r"(^|\.)serve$|inference_servers\."), "inference server launch"),
    (re.compile(r"(^|\.)(main_generate|main_harbor_generate)$"), "generation / evaluation only"),
)

# What an example's own entry module does beyond main_base, and how the check treats it.
#   ("same", why)      : nothing the keys do not already say
#   ("add", {k: v}, why): the entry module's own defaults, added unless the script gives the key
#   ("refuse", why)    : the entry module replaces SkyRL code that hybrid has no equivalent for
_ROLLOUT = "actor_rollout_ref.rollout"
_AGENT = f"{_ROLLOUT}.agent"
_DAPO = ("add", {"trainer.algorithm.overlong_buffer_len": 512, "trainer.algorithm.overlong_buffer_penalty_factor": 1.0})
ENTRY_MODULES: dict[str, tuple] = {
    "examples.train.algorithms.custom_advantage_estimator.main_custom_adv_est": (
        "same",
        "registers the simple_baseline estimator, which hybrid has built in",
    ),
    "examples.train.algorithms.custom_policy_loss.main_custom_policy_loss": (
        "same",
        "registers the reinforce policy loss, which the dialect maps",
    ),
    "examples.train.algorithms.dapo.main_dapo": (
        *_DAPO,
        "DAPO's trainer: the soft overlong penalty, overlong_buffer_len 512 and factor 1.0 unless given",
    ),
    "examples.train.tis_correction.main_tis_dapo": (*_DAPO, "DAPO's trainer with TIS: as main_dapo"),
    "examples.train.algorithms.dapo.main_dapo_fully_async": (
        "add",
        {**_DAPO[1], "trainer.fully_async.max_staleness_steps": 4},
        "SkyRL's fully async trainer with DAPO's soft overlong penalty (staleness 4 unless given)",
    ),
    "examples.train.fully_async.main_fully_async": (
        "add",
        {"trainer.fully_async.max_staleness_steps": 4},
        "SkyRL's fully async trainer (max_staleness_steps 4, SkyRL's default, unless given)",
    ),
    "examples.train.async.main_async": (
        "add",
        {"async_training.max_staleness_steps": 1},
        "SkyRL's one-step-off trainer (generation of the next batch overlaps training on the previous one, the "
        "weights synced after every step): hybrid's one_step_off at lag 1, which a SkyRL line asks for with "
        "hybrid's own key async_training.max_staleness_steps=1 (hybrid/dialects/skyrl.py)",
    ),
    "examples.train.fully_async.main_fully_async_sim": (
        "add",
        {"trainer.fully_async.max_staleness_steps": 4},
        "SkyRL's simulated fully async trainer (a sleep instead of each training step and weight sync, to "
        "benchmark generation; max_staleness_steps 4 unless given): hybrid's async_training.simulate_training, "
        "which the script's trainer.fully_async.simulate_training=true asks for",
    ),
    "examples.train.on_policy_distillation.main_on_policy_distill": (
        "add",
        {"algorithm.on_policy_distillation": "true"},
        "its own trainer: each token's reward is -(student log-prob - teacher log-prob), the teacher loaded as the "
        "reference model (trainer.ref.model.path), and the no_op estimator passes it through: hybrid's "
        "algorithm.on_policy_distillation=true (hybrid/distillation.py)",
    ),
    "examples.train_scripts.full_context.main_full_ctx": (
        "add",
        {"trainer.num_dummy_steps": 5},
        "SkyRL's full-context trainer: trainer.num_dummy_steps (its FullCtxTrainerConfig's default 5 unless given) "
        "steps on random max-length sequences, then the run ends: hybrid's trainer.num_dummy_steps "
        "(hybrid/dummy_steps.py)",
    ),
    "examples.train.mini_swe_agent.main_mini_swe": ("refuse", "its own generator (mini-swe-agent in containers)"),
    "examples.train.rlm.main_rlm": ("refuse", "its own generator (recursive parent/child agents)"),
    "examples.train.thunder_agent.main_thunder_agent": ("refuse", "its own generator (ThunderAgent)"),
    "examples.train.thunder_agent.main_harbor_thunder_agent": (
        "refuse",
        "its own generator (Harbor trials through ThunderAgent)",
    ),
    "examples.train_integrations.harbor.entrypoints.main_harbor": ("refuse", "its own generator (Harbor trials)"),
    "examples.train_integrations.harbor.entrypoints.main_harbor_fully_async": (
        "refuse",
        "its own generator (Harbor trials)",
    ),
    "examples.train_integrations.verifiers.entrypoints.main_verifiers": (
        "add",
        {"generator.inference_engine.enable_http_endpoint": "true", f"{_ROLLOUT}.multi_turn.enable": "true"},
        "its VerifiersGenerator: each row's verifiers environment plays its episode against the engine's "
        "OpenAI-compatible endpoint and the rubric's reward is the trajectory's: hybrid's agent loop verifiers_env "
        "(workers/rollout/verifiers_env.py), environment.env_class naming the environment (agent.verifiers_env)",
    ),
}
# Keys whose meaning an entry module changes: {module: {SkyRL key: hybrid key}}.
ENTRY_RENAMES: dict[str, dict[str, str]] = {
    "examples.train_integrations.verifiers.entrypoints.main_verifiers": {
        "environment.env_class": f"{_AGENT}.verifiers_env"
    },
}
# What an entry module asserts of its keys before anything starts: {module: {key: value}}.
ENTRY_ASSERTS: dict[str, dict[str, str]] = {
    "examples.train.fully_async.main_fully_async_sim": {"trainer.fully_async.simulate_training": "true"},
}
# Entry modules that only register environments (read from their source, see registrations()).
# (main_openreward also copies three OPENREWARD_* variables of the driver's environment into
# its Ray task; hybrid's Ray workers on the driver's machine inherit that environment.)
REGISTERS_ONLY = (
    "examples.train.multiply.main_multiply",
    "examples.train.llm_as_a_judge.main_llm_judge",
    "examples.train.geometry3k.geometry3k_entrypoint",
    "examples.train.visgym.entrypoint",
    "examples.train_integrations.openenv.entrypoints.main_openenv",
    "examples.train_integrations.openreward.entrypoints.main_openreward",
)


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True, text=True).stdout


def registrations(source: str, entry_args: list[str] = ()) -> dict[str, str]:
    """{env id: entry point} of every `register(id="...", entry_point=...)` call in an entry
    module's source (skyrl_gym.envs.register) whose entry point is a literal, or a module-level
    dict literal indexed by a variable named as one of the module's own command-line flags
    (VisGym's `_ENV_ENTRY_POINTS[env_variant]` with `--env_variant instruct`), read from
    `entry_args` as the script passes them."""
    tree = ast.parse(source)
    tables = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Dict)
    }
    flags = {
        a[2:].split("=", 1)[0]: (a.split("=", 1)[1] if "=" in a else None) for a in entry_args if a.startswith("--")
    }
    for i, arg in enumerate(entry_args):
        if arg.startswith("--") and "=" not in arg and i + 1 < len(entry_args):
            flags[arg[2:]] = entry_args[i + 1]
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "register":
            kwargs = {k.arg: k.value for k in node.keywords}
            env_id, entry = kwargs.get("id"), kwargs.get("entry_point")
            if (
                isinstance(entry, ast.Subscript)
                and isinstance(entry.value, ast.Name)
                and isinstance(entry.slice, ast.Name)
            ):
                table, flag = tables.get(entry.value.id), flags.get(entry.slice.id)
                choices = (
                    {
                        k.value: v.value
                        for k, v in zip(table.keys, table.values)
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                    }
                    if table is not None
                    else {}
                )
                entry = ast.Constant(choices[flag]) if flag in choices else entry
            if isinstance(env_id, ast.Constant) and isinstance(entry, ast.Constant):
                found[env_id.value] = entry.value
    return found


def _entry(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of a `uv run ... -m MODULE ...` / `python [-m] X ...` command."""
    if not words or PurePosixPath(words[0]).name not in ("uv", "python", "python3"):
        return None
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            return words[i + 1], words[i + 2 :]
        if word.endswith(".py") and i > 0 and not words[i - 1].startswith("--"):
            return word[: -len(".py")].replace("/", "."), words[i + 1 :]
    return None


def _launch(git_dir: Path, path: str, env: dict[str, str], args: list[str], depth: int = 0) -> dict | None:
    """The script's Python launch: {"entry", "args", "via", "required", "substitutions"}."""
    text = _git(git_dir, "show", f"HEAD:{path}")
    found, expander = commands(text, {"HOME": HOME, **env}, args, str(PurePosixPath(path).parent))
    launches = []
    for command in found:
        entry = _entry(command["words"])
        if entry:
            launches.append({"entry": entry[0], "args": entry[1], "via": [path]})
        elif command["words"][0] == "bash" and depth < 3 and len(command["words"]) > 1:
            inner = command["words"][1]
            inner = inner[2:] if inner.startswith("./") else inner
            sub = _launch(git_dir, inner, {**env, **command["env"]}, command["words"][2:], depth + 1)
            if sub:
                launches.append({**sub, "via": [path, *sub["via"]]})
    if not launches:
        return None
    # A script may prepare data first (uv run .../dataset.py): the training launch is the last.
    launch = launches[-1]
    launch.setdefault("required", sorted(set(expander.required)))
    launch.setdefault("substitutions", expander.substitutions)
    return launch


def _why_not(git_dir: Path, entry: str, argv: list[str]) -> str | None:
    for pattern, why in NOT_TRAINING:
        if pattern.search(entry):
            return why
    if entry not in MAIN_BASE:
        try:
            source = _git(git_dir, "show", f"HEAD:{entry.replace('.', '/')}.py")
        except subprocess.CalledProcessError:
            return "not a training entry point (its module is not in the repository)"
        if not re.search(r"BasePPOExp|RayPPOTrainer|\b[A-Z]\w*Exp\b", source):
            return "not a training entry point (data preparation or a tool)"
    keys = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    if keys.get("trainer.strategy", "fsdp").strip("'\"") == "megatron":
        return "Megatron strategy"
    backend = keys.get("generator.inference_engine.backend", keys.get("generator.backend", "vllm"))
    if backend.strip("'\"") == "sglang":
        return "SGLang backend"
    return None


def extract(git_dir: Path) -> dict:
    git_dir = Path(git_dir)
    commit = _git(git_dir, "rev-parse", "HEAD").strip()
    paths = [p for p in _git(git_dir, "ls-tree", "-r", "--name-only", "HEAD", "examples").splitlines()]
    examples = []
    for path in sorted(p for p in paths if p.endswith(".sh")):
        launch = _launch(git_dir, path, {}, [])
        if launch is None:
            examples.append(
                {
                    "path": path,
                    "selected": False,
                    "why_not": "no Python entry point (setup, cluster or container script)",
                }
            )
            continue
        argv = [a for a in launch["args"] if "=" in a and not a.startswith("-")]
        entry_args = [a for a in launch["args"] if a not in argv]
        why_not = _why_not(git_dir, launch["entry"], argv)
        example = {"path": path, "selected": why_not is None, "why_not": why_not, "entry": launch["entry"]}
        if why_not is None:
            example["argv"] = argv
            if entry_args:
                example["entry_args"] = entry_args
            if launch["via"][1:]:
                example["via"] = launch["via"]
            if launch["required"]:
                example["required_vars"] = launch["required"]
            if launch["substitutions"]:
                example["command_substitutions"] = launch["substitutions"]
            if launch["entry"] not in MAIN_BASE:
                source = _git(git_dir, "show", f"HEAD:{launch['entry'].replace('.', '/')}.py")
                example["registers"] = registrations(source, entry_args)
        examples.append(example)
    return {"commit": commit, "examples": examples}


def _key(arg: str) -> str:
    return arg.split("=", 1)[0]


def check(example: dict, workdir: Path) -> tuple[str, str]:
    entry, argv = example["entry"], list(example["argv"])
    if entry not in MAIN_BASE and entry not in REGISTERS_ONLY:
        if entry not in ENTRY_MODULES:
            return REFUSED, f"entry module {entry}: not read by this check (add it to ENTRY_MODULES)"
        kind, *rest = ENTRY_MODULES[entry]
        values = dict(arg.split("=", 1) for arg in argv)
        for key, value in ENTRY_ASSERTS.get(entry, {}).items():
            if values.get(key, "").strip("'\"").lower() != value:
                return REFUSED, f"entry module {entry}: asserts {key}={value} (SkyRL stops without it)"
        if kind == "refuse":
            return REFUSED, f"entry module {entry}: {rest[0]}"
        if kind == "add":
            given = {_key(a) for a in argv}
            argv += [f"{k}={v}" for k, v in rest[0].items() if k not in given]
        renames = ENTRY_RENAMES.get(entry, {})
        argv = [f"{renames[_key(a)]}={a.partition('=')[2]}" if _key(a) in renames else a for a in argv]
    registered = example.get("registers", {})
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key == "environment.env_class" and value.strip("'\"") in registered:
            # The entry module registers the environment under this id; hybrid loads it the same
            # way, from its module path (run from the SkyRL checkout, as `uv run -m examples...`).
            argv[i] = f"{key}={registered[value.strip(chr(39) + chr(34))]}"
        elif key == "environment.env_class" and entry in REGISTERS_ONLY and value not in registered:
            # What hybrid refuses in the rest of the line comes first; else the registration.
            status, reason = check_argv(["--dialect", "skyrl", *(a for a in argv if a != arg)])
            return REFUSED, reason if status == REFUSED else (
                f"entry module {entry}: registers environment {value!r} in a way this check cannot read "
                f"(not a register(id=..., entry_point=...) call with literal arguments)"
            )
    return check_argv(["--dialect", "skyrl", *argv])


__all__ = ["ENTRY_MODULES", "REPOSITORY", "check", "extract", "registrations"]
