"""Where the process keeps its files: the checkout (BASE_DIR) and var/, which holds the embedded default's SQLite
database and keys (gateway_project/settings/keys.py) and the collected static files."""

from pathlib import Path

from gateway_project.environment import env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("SWITCHBOARD_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)
