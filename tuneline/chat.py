"""`tuneline chat CONFIG`: talk to the trained model through its training template, as `llamafactory-cli chat`
does. The model is the one `tuneline export` would merge (output_dir, else the config's finished MLflow run, else
the adapters the config names); the answers follow the config's generating keys."""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig
from tuneline.errors import ConfigError
from tuneline.trained_model import trained_model_config

CLEAR, EXIT = "clear", "exit"


class Chat:
    """A loaded model and its template; `reply` answers the conversation so far. `model_folder` names the trained
    folder (a registered MLflow model's) instead of looking for the config's."""

    def __init__(self, config: RunConfig, scratch: Path | None = None, model_folder: Path | None = None):
        from tuneline.data import get_template
        from tuneline.evaluation.generation import eos_token_ids
        from tuneline.evaluation.loading import load_eval_model
        from tuneline.model.tokenizer import load_tokenizer
        from tuneline.train.predict import generation_config

        if config.stage == "rm":
            raise ConfigError("'stage: rm' trains a reward model, which scores answers and writes none; chat with the "
                              "config of a model trained to answer (pt, sft, dpo, kto, ppo)")
        loading, self.source = trained_model_config(config, scratch, model_folder)
        self.tokenizer = load_tokenizer(loading.model)
        data = config.data
        self.template = get_template(data.template, self.tokenizer, data.tool_format, data.default_system,
                                     data.tool_date)
        self.model = load_eval_model(loading, self.tokenizer, None)
        self.eos_ids = eos_token_ids(self.tokenizer, self.model) | self._stop_word_ids()
        self.settings = generation_config(config, self.tokenizer, self.eos_ids)
        self.skip_special_tokens = config.generating.skip_special_tokens

    def _stop_word_ids(self) -> set[int]:
        """The template's stop words that are single tokens end an answer too, as the model's turn ends there."""
        vocab = self.tokenizer.get_vocab()
        return {vocab[word] for word in self.template.stop_words if word in vocab}

    def reply(self, messages: list[dict], system: str | None = None) -> str:
        from tuneline.evaluation.generation import generate_batches

        prompt, _ = self.template.encode_oneturn(self.tokenizer, [*messages, {"role": "assistant", "content": ""}],
                                                 system)
        [answer] = generate_batches(self.model, [prompt], self.settings, self.tokenizer.pad_token_id, self.eos_ids, 1)
        return self.tokenizer.decode(answer, skip_special_tokens=self.skip_special_tokens).strip()


def chat_loop(chat: Chat, read, write) -> None:
    """Turn after turn until `exit` or end of input; `clear` starts a new conversation."""
    history: list[dict] = []
    write(f"chatting with {chat.source or 'the adapters the config names'}; '{CLEAR}' starts over, '{EXIT}' "
          "ends\n")
    while True:
        try:
            said = read("User: ").strip()
        except EOFError:
            return
        if said == EXIT:
            return
        if said == CLEAR:
            history = []
            continue
        if not said:
            continue
        history.append({"role": "user", "content": said})
        answer = chat.reply(history)
        history.append({"role": "assistant", "content": answer})
        write(f"Assistant: {answer}\n")
