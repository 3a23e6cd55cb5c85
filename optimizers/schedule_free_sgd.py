"""Schedule-Free SGD (Defazio, Yang, Mehta, Mishchenko, Khaled & Cutkosky, 2024, "The Road Less Scheduled"), from
optax.contrib.schedule_free around SGD: z takes gradient steps of size sf_lr (warmed up over sf_warmup steps inside
the method), x is z's average weighted by max lr^weight_lr_power, and the model's weights are
y = (1 - momentum) z + momentum x, where the gradient is taken. L2 weight decay on the matrices, at y.

As for schedule_free_adamw (its docstring says why): the method's lr is sf_lr, the run's lr schedule does not
reach it (registered with lr="own"), and evaluation must use x:
`optax.contrib.schedule_free_eval_params(optax.tree.get(opt_state, "ScheduleFreeState"), params)`."""

from __future__ import annotations

import optax

from optimizers.decay import l2
from optimizers.registry import register
from optimizers.schedule_free_adamw import SCHEDULE_FREE, one_step_ahead, require_positive_beta1, warmed_up


@register("schedule_free_sgd", **SCHEDULE_FREE)
def schedule_free_sgd(
    model, *, sf_lr: float, sf_warmup: float, momentum: float, weight_decay: float, weight_lr_power: float
) -> optax.GradientTransformation:
    require_positive_beta1(momentum, "schedule_free_sgd", "momentum")
    lr = warmed_up(sf_lr, sf_warmup)
    sgd = optax.chain(l2(weight_decay, model.weight_decay_mask()), optax.sgd(one_step_ahead(lr)))
    return optax.contrib.schedule_free(sgd, lr, b1=momentum, weight_lr_power=weight_lr_power)
