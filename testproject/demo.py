"""`make demo`: migrate the demo site on SQLite, queue a batch of jobs and run a worker on them."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def manage(*args: str) -> None:
    subprocess.run([sys.executable, str(HERE / "manage.py"), *args], check=True, cwd=HERE)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(HERE))
    manage("migrate", "--verbosity", "0")
    import django

    django.setup()
    from media import jobs

    jobs.thumbnail.enqueue_many([{"image_id": i} for i in range(200)])
    jobs.transcode.enqueue_many([{"video_id": i} for i in range(8)])
    print("queued 200 thumbnails and 8 transcodes; running durq_worker --burst")
    manage("durq_worker", "--burst")


if __name__ == "__main__":
    main()
