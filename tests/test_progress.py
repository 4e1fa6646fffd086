"""The evaluation progress bar counts every image of a validation / test run once and ends its line."""
from types import SimpleNamespace

from mmvisatt.engine import EvalProgressBarHook


def _runner(num_images: int, batch_size: int):
    loader = SimpleNamespace(dataset=list(range(num_images)), batch_size=batch_size)
    return SimpleNamespace(val_dataloader=loader, test_dataloader=loader)


def test_bar_counts_images_and_stops_at_the_dataset_size(capsys):
    hook, runner = EvalProgressBarHook(), _runner(num_images=5, batch_size=2)
    for start, step, end in ((hook.before_val_epoch, hook.after_val_iter, hook.after_val_epoch),
                             (hook.before_test_epoch, hook.after_test_iter, hook.after_test_epoch)):
        start(runner)
        for i in range(3):  # 2 + 2 + 1 images
            step(runner, i)
        assert hook._bar.completed == 5
        end(runner)
        assert hook._bar is None
    out = capsys.readouterr().out
    assert out.count('5/5') == 2 and out.endswith('\n')
