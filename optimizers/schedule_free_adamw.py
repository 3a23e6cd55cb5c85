"""Schedule-Free AdamW (Defazio, Yang, Mehta, Mishchenko, Khaled & Cutkosky, 2024, "The Road Less Scheduled"), from
optax.contrib.schedule_free around Adam's second-moment scaling: z takes Adam steps of size sf_lr (warmed up over
sf_warmup steps inside the method, as the paper does), x is z's average weighted by max lr^weight_lr_power, and the
model's weights are y = (1 - beta1) z + beta1 x, where the gradient is taken. Decoupled weight decay on the matrices,
at y, scaled by the lr (sf_lr x weight_decay x y).

The method's lr is sf_lr, not the pipeline's: the direction is y_new - y, and the method recovers x from y and z, so
any other multiple of that step breaks y = (1 - beta1) z + beta1 x. So the run's lr schedule does not reach it
(registered with lr="own": the pipeline's lr is 1 throughout); there is no schedule to tune, which is the point.

Evaluation must use x, not the weights y: `optax.contrib.schedule_free_eval_params(sf_state, params)` with
`sf_state = optax.tree.get(opt_state, "ScheduleFreeState")` (the pipeline's state is a chain, possibly inside
MultiSteps). Unlike optax.contrib.schedule_free_adamw, whose z step reads its warmup one step behind the averaging
weight (so z stays put at the first step), both read lr x min(1, t / sf_warmup) at the t-th update, as the reference
implementation does."""

from __future__ import annotations

import optax

from core.errors import ConfigError
from optimizers.decay import fixed
from optimizers.registry import register


def warmed_up(lr: float, warmup: float) -> optax.ScalarOrSchedule:
    """lr x min(1, t / warmup) at step count t (schedule_free counts from 1). The pipeline gives `warmup` in steps
    (optimizers/schedules.py: own_warmups_in_steps turns a fraction of the run into steps)."""
    return optax.warmup_constant_schedule(0.0, lr, warmup) if warmup > 0 else lr


def one_step_ahead(schedule: optax.ScalarOrSchedule) -> optax.ScalarOrSchedule:
    """A schedule for a transformation counting from 0, read as schedule_free's, which counts from 1."""
    return (lambda count: schedule(count + 1)) if callable(schedule) else schedule


def require_positive_beta1(beta1: float, name: str, key: str) -> None:
    if beta1 <= 0:
        raise ConfigError(
            f"config: optimizer.{key}: {name} needs it > 0 (x is recovered from y and z by dividing by it); got {beta1}"
        )


# How both schedule-free methods register: their own step size and warmup, and the average they evaluate
SCHEDULE_FREE = dict(
    lr="own", averaged=True, bounds={"sf_lr": "positive", "sf_warmup": "non_negative"}, step_size="sf_lr"
)


@register("schedule_free_adamw", **SCHEDULE_FREE)
def schedule_free_adamw(
    model,
    *,
    sf_lr: float,
    sf_warmup: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    weight_lr_power: float,
) -> optax.GradientTransformation:
    require_positive_beta1(beta1, "schedule_free_adamw", "beta1")
    lr = warmed_up(sf_lr, sf_warmup)
    adam = optax.chain(
        optax.scale_by_rms(decay=beta2, eps=eps, eps_in_sqrt=False, bias_correction=True),
        optax.add_decayed_weights(weight_decay, fixed(model.weight_decay_mask())),
        optax.scale_by_learning_rate(one_step_ahead(lr)),
    )
    return optax.contrib.schedule_free(adam, lr, b1=beta1, weight_lr_power=weight_lr_power)
