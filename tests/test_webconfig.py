"""exporter-toolkit's web config (``--web.config.file``): TLS, client certificates and bcrypt
basic auth, checked with a real Prometheus scraping a real agent (issue 30, Transport)."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import free_port, wait_for
from rankwatch.server.webconfig import WebConfigError, load_web_config

ROOT = Path(__file__).resolve().parent.parent
PORT = re.compile(r"serving metrics and API on [^\s]+:(\d+)\n.*web config .*: (HTTPS only)")


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    p = tmp_path / "web.yml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.unit
@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"tls_server_config": {"cert_file": "a"}}, "cert_file and key_file are both required"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "bogus": 1}}, "unknown key(s) bogus"),
        ({"tsl_server_config": {}}, "unknown key(s) tsl_server_config"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b"}}, "cert_file: "),
        (
            {
                "tls_server_config": {
                    "cert_file": "a",
                    "key_file": "b",
                    "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
                }
            },
            "cipher_suites is not supported",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "a",
                    "key_file": "b",
                    "client_auth_type": "RequireAnyClientCert",
                }
            },
            "without being verified is not supported",
        ),
        ({"basic_auth_users": {"prometheus": "hunter2"}}, "expected a bcrypt hash"),
        ({"http_server_config": {"http3": True}}, "only http2 and headers"),
    ],
)
def test_a_wrong_web_config_is_refused_naming_the_key(tmp_path: Path, doc: dict[str, Any], says: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert str(path) in str(e.value) and says in str(e.value)
    assert "hunter2" not in str(e.value)


# --- real TLS, a real Prometheus -------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=rankwatch test CA", cwd=d)  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


def _get(url: str, ctx: ssl.SSLContext | None, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if auth:
        import base64

        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.tool
def test_a_real_prometheus_scrapes_the_agent_over_tls_with_a_client_cert_and_basic_auth(
    tmp_path: Path,
) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None or shutil.which("openssl") is None:
        pytest.skip("prometheus and openssl not installed (Debian packages prometheus, openssl)")
    bcrypt = pytest.importorskip("bcrypt", reason="bcrypt is a dependency of rankwatch")
    pki = tmp_path / "pki"
    _pki(pki)
    hashed = (
        bcrypt.hashpw(b"s3cret-scrape", bcrypt.gensalt(10)).decode().replace("$2b$", "$2y$", 1)
    )  # htpasswd -B
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": "pki/server.crt",  # relative to the web config file
                    "key_file": "pki/server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": "pki/ca.crt",
                    "min_version": "TLS12",
                },
                "basic_auth_users": {"prometheus": hashed},
                "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
            }
        )
    )
    log = tmp_path / "rank-0.log"
    log.write_text("step=1 loss=2.5 step_time=0.5\n")
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: tlsrun}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\nserver: {{listen: '127.0.0.1:0'}}\n"
        "gpu: {enabled: false}\n"
    )
    procs: list[subprocess.Popen[bytes]] = []
    err = tmp_path / "agent.err"
    env = {"PYTHONPATH": str(ROOT / "agent"), "PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path)}
    try:
        with open(err, "wb") as fh:
            cmd = [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg), "--log", str(log),
                   "--web.config.file", str(web)]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, env=env))
        m = wait_for(lambda: PORT.search(err.read_text(errors="replace")), 30, "the agent's port")
        assert m.group(2) == "HTTPS only", err.read_text()
        port = int(m.group(1))
        base = f"https://127.0.0.1:{port}"

        client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        client.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
        no_cert = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        status, body = _get(base + "/metrics", client, ("prometheus", "s3cret-scrape"))
        assert status == 200 and "rankwatch_build" in body
        assert _get(base + "/metrics", client, ("prometheus", "wrong"))[0] == 401
        assert _get(base + "/metrics", client, ("nobody", "s3cret-scrape"))[0] == 401
        assert _get(base + "/metrics", client)[0] == 401
        assert _get(base + "/healthz", client)[0] == 200  # probes stay open (with TLS)
        with urllib.request.urlopen(
            urllib.request.Request(base + "/healthz"), timeout=10, context=client
        ) as r:
            assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
        # no client certificate: refused in the handshake (TLS 1.3: the server then closes)
        with pytest.raises(OSError):
            _get(base + "/healthz", no_cert)
        with pytest.raises(OSError):  # plain HTTP is not served
            _get(f"http://127.0.0.1:{port}/healthz", None)

        # rankwatch top over the same TLS, with the client certificate and the agent's token file
        top = subprocess.run(
            [sys.executable, "-m", "rankwatch", "top", "--once", base, "--cacert", str(pki / "ca.crt"),
             "--cert", str(pki / "client.crt"), "--key", str(pki / "client.key")],
            capture_output=True, text=True, timeout=60, env={**env, "NO_COLOR": "1", "COLUMNS": "100"},
        )  # fmt: skip
        said = top.stdout + top.stderr
        assert top.returncode == 0 and "1 rank(s)" in top.stdout and "! " not in top.stdout, said

        prom_port = free_port()
        tls = {
            "ca_file": str(pki / "ca.crt"),
            "cert_file": str(pki / "client.crt"),
            "key_file": str(pki / "client.key"),
        }
        target = {"targets": [f"127.0.0.1:{port}"]}
        jobs = [
            {"job_name": "good", "scheme": "https", "tls_config": tls, "static_configs": [target],
             "basic_auth": {"username": "prometheus", "password": "s3cret-scrape"}},
            {"job_name": "badpass", "scheme": "https", "tls_config": tls, "static_configs": [target],
             "basic_auth": {"username": "prometheus", "password": "nope"}},
            {"job_name": "nocert", "scheme": "https", "tls_config": {"ca_file": str(pki / "ca.crt")},
             "static_configs": [target],
             "basic_auth": {"username": "prometheus", "password": "s3cret-scrape"}},
        ]  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs})
        )
        with open(tmp_path / "prometheus.log", "wb") as fh:
            procs.append(
                subprocess.Popen(
                    [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                    stdout=fh, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        api = f"http://127.0.0.1:{prom_port}/api/v1/"

        def targets() -> dict[str, Any] | None:
            try:
                with urllib.request.urlopen(api + "targets", timeout=5) as r:
                    doc = json.loads(r.read())
            except OSError:
                return None
            got = {t["labels"]["job"]: t for t in doc["data"]["activeTargets"]}
            done = len(got) == 3 and all(t["health"] != "unknown" for t in got.values())
            return got if done else None

        got = wait_for(targets, 40, "three scraped targets", interval=0.5)
        assert got["good"]["health"] == "up", got["good"]
        assert got["badpass"]["health"] == "down" and "401" in got["badpass"]["lastError"]
        assert got["nocert"]["health"] == "down"
        query = urllib.parse.urlencode({"query": 'rankwatch_build_info{job="good"}'})

        def built() -> Any:
            with urllib.request.urlopen(api + "query?" + query, timeout=5) as r:
                return json.loads(r.read())["data"]["result"]

        assert wait_for(built, 20, "rankwatch_build scraped over TLS", interval=0.5)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
