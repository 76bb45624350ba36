"""``python -m bench.peer_apps.produce FRAMEWORK ID...``: one message per ID, in the framework's
own format, sent with its own API."""

from __future__ import annotations

import importlib
import sys


def main() -> None:
    framework, ids = sys.argv[1], sys.argv[2:]
    app = importlib.import_module(f"bench.peer_apps.{framework}_app")
    for job_id in ids:
        if framework == "celery":
            app.job.delay(job_id)
        elif framework == "dramatiq":
            app.job.send(job_id)
        else:
            app.job.delay(job_id=job_id)


if __name__ == "__main__":
    main()
