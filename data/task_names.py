"""The piano tasks by name, defined once. Their order is the order of their tokens in the notes vocabulary
(data/notes_tokenizer.py: changing it changes what a trained model's ids mean); data/tasks.py says what each poses."""

DYNAMICS = "dynamics"
CONTINUATION = "continuation"
LOWER_VOICES = "lower_voices"
TASK_NAMES = (DYNAMICS, CONTINUATION, LOWER_VOICES)
