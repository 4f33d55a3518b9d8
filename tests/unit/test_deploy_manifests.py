"""deploy/: the Kubernetes manifests against the Kubernetes API schema, the Dockerfile and the Apptainer
definition against the repository, and every horovodrun command in them against horovodrun's parser.

No cluster and no container engine run here. Core kinds are validated with ``kubernetes-validate`` (the API's
JSON schemas, strict: unknown fields are errors). The Kubeflow ``MPIJob`` is a custom resource whose schema no
package ships: its pod templates are validated as core ``PodTemplate``s, and its other fields against
:data:`MPIJOB_V2BETA1`, transcribed from mpi-operator's v2beta1 API (``pkg/apis/kubeflow/v2beta1/types.go``).
"""
import json
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from horovod.runner import launch
from horovod.runner.common.util import hosts

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
K8S_VERSION = kubernetes_validate.latest_version()

_REPLICA = {
    "type": "object", "additionalProperties": False, "required": ["template"],
    "properties": {"replicas": {"type": "integer", "minimum": 0},
                   "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                   "template": {"type": "object"}},
}
MPIJOB_V2BETA1 = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"}, "kind": {"const": "MPIJob"}, "metadata": {"type": "object"},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["mpiReplicaSpecs"],
            "properties": {
                "slotsPerWorker": {"type": "integer", "minimum": 1},
                "runLauncherAsWorker": {"type": "boolean"},
                "runPolicy": {"type": "object", "additionalProperties": False, "properties": {
                    "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                    "ttlSecondsAfterFinished": {"type": "integer"}, "activeDeadlineSeconds": {"type": "integer"},
                    "backoffLimit": {"type": "integer"}, "schedulingPolicy": {"type": "object"},
                    "suspend": {"type": "boolean"}, "managedBy": {"type": "string"}}},
                "mpiReplicaSpecs": {"type": "object", "additionalProperties": False, "required": ["Launcher"],
                                    "properties": {"Launcher": _REPLICA, "Worker": _REPLICA}},
                "sshAuthMountPath": {"type": "string"},
                "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
                "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
            },
        },
    },
}


def documents():
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_templates(doc):
    if doc["kind"] == "MPIJob":
        return {role: spec["template"] for role, spec in doc["spec"]["mpiReplicaSpecs"].items()}
    if doc["kind"] in ("Job", "StatefulSet", "Deployment"):
        return {doc["kind"]: doc["spec"]["template"]}
    return {}


def test_there_are_manifests_for_the_operator_and_plain_kubernetes():
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"MPIJob", "Job", "Service", "Secret"} <= kinds


@pytest.mark.parametrize("name, doc", documents(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_manifest_matches_the_kubernetes_api_schema(name, doc):
    if doc["kind"] == "MPIJob":
        jsonschema.validate(doc, MPIJOB_V2BETA1)
        for role, template in pod_templates(doc).items():
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
                       "template": template}
            kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validation_rejects_what_kubernetes_rejects():
    _, job = next((n, d) for n, d in documents() if d["kind"] == "Job")
    bad = json.loads(json.dumps(job))
    bad["spec"]["template"]["spec"]["containers"][0]["arg"] = ["typo"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    _, mpijob = next((n, d) for n, d in documents() if d["kind"] == "MPIJob")
    bad = json.loads(json.dumps(mpijob))
    bad["spec"]["slotsPerWorkers"] = 2
    with pytest.raises(jsonschema.ValidationError, match="slotsPerWorkers"):
        jsonschema.validate(bad, MPIJOB_V2BETA1)


# --- the Dockerfile ---------------------------------------------------------------------------------------

DOCKER_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD",
                       "LABEL", "USER", "VOLUME", "SHELL", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD"}


def dockerfile():
    """(instruction, arguments) pairs, continuation lines joined and comments dropped."""
    instructions, current = [], ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        name, _, rest = current.strip().partition(" ")
        instructions.append((name.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continuation line"
    return instructions


def docker_defaults():
    """Every ARG and ENV with its default value."""
    values = {}
    for name, rest in dockerfile():
        if name == "ARG":
            key, _, value = rest.partition("=")
            values[key] = value
        elif name == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", rest):
                values[key] = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], value)
    return values


def extras():
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def horovodrun_args(argv):
    """The arguments after ``horovodrun`` in a command, parsed by horovodrun's own parser."""
    assert "horovodrun" in argv, argv
    args = launch.parse_args(list(argv[argv.index("horovodrun") + 1:]))
    assert args.command, f"no program to run in {argv}"
    if args.hosts:
        hosts.parse_hosts(args.hosts)
    return args


def test_dockerfile_parses_and_copies_files_that_exist():
    instructions = dockerfile()
    assert instructions[0][0] in ("ARG", "FROM") and {n for n, _ in instructions} <= DOCKER_INSTRUCTIONS
    defined = set()
    for name, rest in instructions:
        for used in re.findall(r"\$\{(\w+)\}", rest):
            assert used in defined, f"{name} {rest}: ${{{used}}} is used before an ARG/ENV defines it"
        if name == "ARG":
            defined.add(rest.partition("=")[0])
        elif name == "ENV":
            defined.update(re.findall(r"(\w+)=", rest))
        elif name == "COPY":
            sources = shlex.split(rest)[:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such file in the build context (the repo)"
        elif name in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(rest), list), f"{name} must be an exec-form JSON array"
    assert set(docker_defaults()["HOROVOD_EXTRAS"].split(",")) <= extras()


def test_dockerfile_default_command_runs_an_example_that_exists():
    instructions = dict(dockerfile())
    cmd = json.loads(instructions["CMD"])
    assert cmd[0] == "launcher"
    args = horovodrun_args(cmd)
    workdir = Path(instructions["WORKDIR"]).relative_to("/opt/horovod")
    assert (ROOT / workdir / args.command[1]).is_file()


def test_entrypoint_and_sshd_config():
    entrypoint = DEPLOY / "entrypoint.sh"
    subprocess.run(["sh", "-n", str(entrypoint)], check=True)
    out = subprocess.run(["sh", str(entrypoint), "echo", "as", "given"], capture_output=True, text=True, timeout=10)
    assert out.stdout == "as given\n" and out.returncode == 0
    sshd = dict(line.split(None, 1) for line in (DEPLOY / "sshd_config").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    assert sshd["PasswordAuthentication"] == "no" and sshd["KbdInteractiveAuthentication"] == "no"
    assert sshd["PermitRootLogin"] == "prohibit-password"


# --- the commands in the manifests --------------------------------------------------------------------------

def containers(doc):
    return [(role, c) for role, t in pod_templates(doc).items() for c in t["spec"]["containers"]]


def test_mpijob_runs_horovodrun_on_every_slot_with_the_images_keys():
    _, job = next((n, d) for n, d in documents() if d["kind"] == "MPIJob")
    spec, image = job["spec"], docker_defaults()
    (_, launcher), = [(r, c) for r, c in containers(job) if r == "Launcher"]
    args = horovodrun_args(launcher["args"])
    assert args.np == spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert args.hostfile == "/etc/mpi/hostfile"                 # written by the operator
    assert spec["sshAuthMountPath"] == image["HOROVOD_SSH_KEY_DIR"]
    (_, worker), = [(r, c) for r, c in containers(job) if r == "Worker"]
    assert worker["args"] == ["worker"] and worker["ports"][0]["containerPort"] == int(image["SSH_PORT"])


def test_indexed_job_ranks_match_its_pods_service_and_secret():
    docs = {d["kind"]: d for _, d in documents() if d["kind"] in ("Job", "Service", "Secret")}
    job, service, image = docs["Job"], docs["Service"], docker_defaults()
    pod = job["spec"]["template"]["spec"]
    (_, container), = containers(job)
    assert container["args"][0] == "indexed"
    args = horovodrun_args(container["args"])
    infos = hosts.parse_hosts(args.hosts)
    name, pods = job["metadata"]["name"], job["spec"]["completions"]
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert [h.hostname for h in infos] == ["localhost"] + [f"{name}-{i}.{pod['subdomain']}" for i in range(1, pods)]
    assert args.np == sum(h.slots for h in infos)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HOROVOD_WAIT_FOR"].split(",") == [f"{h.hostname}:{image['SSH_PORT']}" for h in infos[1:]]
    assert job["spec"]["successPolicy"]["rules"] == [{"succeededIndexes": "0"}]
    mount, = container["volumeMounts"]
    assert mount["mountPath"] == image["HOROVOD_SSH_KEY_DIR"]
    assert pod["volumes"][0]["secret"]["secretName"] == docs["Secret"]["metadata"]["name"]
    assert {"id_rsa", "authorized_keys"} <= set(docs["Secret"]["stringData"])


# --- the Apptainer definition -------------------------------------------------------------------------------

DEF_SECTIONS = {"setup", "files", "environment", "post", "runscript", "startscript", "test", "labels", "help",
                "arguments"}


def definition():
    """The header (key -> value) and the sections (name -> lines) of deploy/singularity/horovod.def."""
    header, sections, current = {}, {}, None
    for line in (DEPLOY / "singularity" / "horovod.def").read_text().splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            assert current in DEF_SECTIONS, f"unknown section %{current}"
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line.strip() and not line.startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
    return header, sections


def test_definition_file_parses_and_refers_to_files_that_exist():
    header, sections = definition()
    assert header["Bootstrap"] == "docker" and header["From"]
    assert {"files", "post", "runscript"} <= set(sections)
    for line in filter(str.strip, sections["files"]):
        source, destination = line.split()
        assert (ROOT / source).exists() and destination.startswith("/opt/horovod/")
    arguments = dict(line.strip().split("=", 1) for line in sections["arguments"] if line.strip())
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", "\n".join(sections["post"]))) <= set(arguments)
    assert set(arguments["EXTRAS"].split(",")) <= extras()
    assert "exec horovodrun" in "\n".join(sections["runscript"])
    example = " ".join(line.strip() for line in sections["help"] if "horovodrun -np" in line)
    args = horovodrun_args(shlex.split(example))
    assert args.command[:2] == ["apptainer", "exec"] and args.np == 4
