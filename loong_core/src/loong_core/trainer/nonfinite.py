"""``trainer.exit_on_nan``: non-finite losses, gradients and weights never reach a checkpoint.

The engines skip the update of a step whose loss or gradients are NaN/inf (and say so in
:attr:`~loong_core.engines.base.StepResult.nonfinite`). This guard then either stops the run with
an error naming the step and the last good checkpoint (``exit_on_nan=true``) or lets it go on,
the step counted in ``skipped_steps`` (``false``). A non-finite validation loss is treated the
same way, and before every save the weights are checked on all ranks: a checkpoint with NaN/inf
weights, or taken while the latest validation loss is NaN/inf, is never written, whatever
``exit_on_nan`` says.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from loong_core.errors import TrainingError

logger = logging.getLogger(__name__)


class NonFiniteGuard:
    """Applies ``trainer.exit_on_nan`` to what the loop sees.

    Args:
        exit_on_nan: Stop at the first non-finite loss or gradient.

    Attributes:
        last_good: The newest checkpoint this run wrote or resumed from (None: none yet).
    """

    def __init__(self, exit_on_nan: bool):
        self.exit_on_nan = exit_on_nan
        self.last_good: Path | None = None
        self._bad_validation: tuple[int, float] | None = None

    def _fix(self) -> str:
        if self.last_good is None:
            return "There is no checkpoint of this run yet: lower optim.lr or check the data and start again."
        return (f"The last good checkpoint is {self.last_good}: lower optim.lr or check the data, then "
                f"continue from it with trainer.resume={self.last_good}.")

    def check_step(self, step: int, result) -> None:
        """After a train step: stop, or log that its update was skipped."""
        if math.isfinite(result.loss) and not result.nonfinite:
            return
        what = f"loss {result.loss}, grad norm {result.grad_norm}"
        if self.exit_on_nan:
            raise TrainingError(f"non-finite values at step {step} ({what}); the update was not applied. "
                                f"{self._fix()} (trainer.exit_on_nan=false skips such steps instead).")
        logger.warning("step %d: non-finite values (%s); update skipped, counted in skipped_steps", step, what)

    def check_validation(self, step: int, loss: float) -> None:
        """After an evaluation: a NaN/inf validation loss means the weights went bad."""
        self._bad_validation = None if math.isfinite(loss) else (step, loss)
        if math.isfinite(loss):
            return
        if self.exit_on_nan:
            raise TrainingError(f"validation loss is {loss} at step {step}. {self._fix()}")
        logger.warning("step %d: validation loss is %s; no checkpoint is written until it is finite again",
                       step, loss)

    def check_weights(self, step: int, engine) -> None:
        """Before a save (collective): refuse to write NaN/inf weights.

        Raises:
            TrainingError: The latest validation loss or some weight (on any rank) is not finite.
        """
        if self._bad_validation is not None:
            at, loss = self._bad_validation
            raise TrainingError(f"no checkpoint was written at step {step}: the validation loss at step {at} "
                                f"was {loss}. {self._fix()}")
        if not engine.weights_finite():
            raise TrainingError(f"the weights are not finite at step {step}, so no checkpoint was "
                                f"written. {self._fix()}")
