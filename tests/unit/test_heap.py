import gc

from xwm_bridge.heap import freeze_startup


def test_freeze_startup_moves_the_live_heap_out_of_the_generations() -> None:
    try:
        frozen = freeze_startup()
        assert frozen > 1000 and gc.get_freeze_count() == frozen
        assert len(gc.get_objects()) < frozen
    finally:
        gc.unfreeze()
