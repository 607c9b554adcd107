import gc

from xwm_bridge.heap import MIDDLE_THRESHOLD, YOUNG_THRESHOLD, freeze_startup


def test_freeze_startup_moves_the_live_heap_out_of_the_generations() -> None:
    before = gc.get_threshold()
    try:
        frozen = freeze_startup()
        assert frozen > 1000 and gc.get_freeze_count() == frozen
        assert len(gc.get_objects()) < frozen
        assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
