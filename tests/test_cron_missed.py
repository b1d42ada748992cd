

def test_passes_start_just_after_each_whole_second_however_long_the_last_one_took():
    from django_durq.conf import get_settings
    from django_durq.worker.maintenance import PASS_OFFSET_MS, MaintenanceRunner
    from django_durq.worker.runtime import Runtime

    clock = ManualClock(start_ms=at(2024, 5, 6, 12))
    runner = MaintenanceRunner(Runtime(settings=get_settings(), clock=clock))
    for elapsed_ms in (0, 1, 370, 999, 1_000 + PASS_OFFSET_MS, 2_650, 7_999):
        clock.set(at(2024, 5, 6, 12) + PASS_OFFSET_MS + elapsed_ms)
        following = clock.now_ms() + round(runner._until_next_pass_s() * 1000)
        assert following % 1000 == PASS_OFFSET_MS and 0 < following - clock.now_ms() <= 1000, elapsed_ms
