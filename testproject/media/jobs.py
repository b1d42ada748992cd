"""A small media pipeline: the jobs the demo runs."""

import random
import time

from django_durq import job


@job(name="media.thumbnail")
def thumbnail(ctx, image_id):
    time.sleep(0.01)
    return {"image_id": image_id, "size": "128x128"}


@job(name="media.transcode", queue="video", max_attempts=3)
def transcode(ctx, video_id, quality="720p"):
    for step in range(5):
        time.sleep(0.1)
        ctx.progress(step + 1, 5)
        if ctx.should_stop():
            return None
    if random.random() < 0.2:
        raise RuntimeError(f"encoder crashed on video {video_id}")
    return {"video_id": video_id, "quality": quality}
