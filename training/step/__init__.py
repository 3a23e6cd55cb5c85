"""What runs under jit: the train state, the losses, the compiled train and eval steps, mixed precision, and the
statistics the step gathers on the way (update geometry among them). Imports distributed/ only."""
