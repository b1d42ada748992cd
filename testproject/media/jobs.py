"""A small media pipeline: the jobs `make demo` runs.

Handlers take a few seconds and report progress; failures are decided by the attempt number, not
by chance, so that every run of the demo tells the same story: one thumbnail and one transcode
fail once and then succeed, and one upload fails every attempt and ends in the dead letters.
A workflow runs them in order for one video: scan the upload, then three transcodes at once, then
publish once all three are done.
"""

import time

from django_durq import Retry, job

# Uploads that are broken for good, and images whose first attempt fails: the demo's faults.
TRUNCATED_UPLOADS = {13}
FLAKY_IMAGES = {7}
BUSY_ENCODER_VIDEOS = {3}


def work(ctx, seconds, steps):
    """Spend ``seconds`` in ``steps`` chunks, reporting progress; False if asked to stop."""
    for done in range(1, steps + 1):
        if ctx.should_stop():
            return False
        time.sleep(seconds / steps)
        ctx.progress(done, steps)
    return True


@job(name="media.thumbnail", queue="default", max_attempts=3)
def thumbnail(ctx, image_id, size="320x180"):
    if image_id in FLAKY_IMAGES and ctx.attempt == 1:
        raise ConnectionError(f"image {image_id}: the original is not on this storage node yet")
    work(ctx, 0.6, 3)
    return {"image_id": image_id, "size": size}


@job(name="media.transcode", queue="video", max_attempts=4, lease=30, timeout=60)
def transcode(ctx, video_id, quality="720p"):
    if video_id in BUSY_ENCODER_VIDEOS and ctx.attempt == 1:
        raise Retry(after=2, reason=f"encoder busy; video {video_id} waits 2 s")
    for chunk in range(1, 11):
        if ctx.should_stop():
            return None  # shutting down: the job is handed back and runs again later
        time.sleep(0.45)  # encode one chunk
        ctx.progress(chunk, 10)
        if chunk == 5 and not ctx.heartbeat():
            return None  # another worker took the job over: leave the output to it
    return {"video_id": video_id, "quality": quality, "chunks": 10}


@job(name="media.scan_upload", queue="default", max_attempts=3)
def scan_upload(ctx, upload_id):
    work(ctx, 0.3, 1)
    if upload_id in TRUNCATED_UPLOADS:
        raise ValueError(f"upload {upload_id} is truncated: expected 4096 bytes, got 1024")
    return {"upload_id": upload_id, "clean": True}


@job(name="media.publish", queue="default")
def publish(ctx, video_id):
    """Publish a video; in a workflow, once its transcodes are done, listing the renditions they made."""
    work(ctx, 0.2, 1)
    renditions = [u.result["quality"] for u in ctx.dependencies() if u.name == "media.transcode" and u.status == "finished"]
    return {"video_id": video_id, "published": True, **({"renditions": renditions} if renditions else {})}


@job(name="media.rebuild_feed", queue="default")
def rebuild_feed(ctx, feed):
    work(ctx, 1.0, 4)
    return {"feed": feed}


@job(name="media.purge_tmp", queue="default", cron="*/15 * * * *")
def purge_tmp(ctx):
    """Every 15 minutes, on exactly one worker: clear the scratch space of finished transcodes."""
    work(ctx, 0.2, 1)
    return {"purged": 0}
