"""The LLM reasoner: any OpenAI-compatible chat-completions server, structured output.

Each decision is one conversation: a system message with the rules of the game, a user
message that is nothing but the evidence, as one JSON document of untrusted data (built,
cleaned and escaped by :mod:`flotilla_reasoning.prompt`: nothing in it can become an
instruction), and ``response_format`` set to the decision's JSON Schema in the form the
server speaks (:mod:`flotilla_reasoning.dialects`). The answer is
parsed and validated (:mod:`flotilla_reasoning.decision`); a bad
answer gets exactly one more chance, with the problems appended to the conversation,
and a second bad answer raises :class:`ReasoningFailed` — the agent escalates and the
answer never becomes a record. Tokens are summed over both attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from prometheus_client import Counter, Gauge

from flotilla import tracing
from flotilla_reasoning.base import ReasoningFailed
from flotilla_reasoning.decision import (
    DIAGNOSIS_SCHEMA,
    PROPOSAL_SCHEMA,
    InvalidDecision,
    diagnosis_from_answer,
    proposal_from_answer,
)
from flotilla_reasoning.dialects import AUTO_ORDER, Dialect, DialectChoice, format_refused, response_format
from flotilla_reasoning.model import Diagnosis, DiagnosticEvidence, Proposal, TokenUsage, Topology, Verdict
from flotilla_reasoning.prompt import (
    DIAGNOSE_SYSTEM,
    PROPOSE_SYSTEM,
    conversation,
    diagnosis_facts,
    proposal_facts,
    rejection,
    with_schema,
)
from flotilla_reasoning.settings import AgentSettings

log = logging.getLogger(__name__)

NAME = "llm"
ATTEMPTS = 2  # the first answer and one retry with the validation errors

T = TypeVar("T")

# Labelled with the configured model (FLOTILLA_LLM_MODEL), not the name a server echoes
# back (often a dated snapshot), so the series stay few and match the settings.
LLM_TOKENS = Counter(
    "flotilla_llm_tokens_total",
    "Model tokens spent by the LLM reasoner, rejected answers included, by model and kind (prompt, completion).",
    ["model", "kind"],
)

LLM_DIALECT = Gauge(
    "flotilla_llm_response_format_info",
    "The response-format dialect the LLM reasoner found the model server accepts (1 for the one in use).",
    ["dialect"],
)


class LLMReasoner:
    """Decides by asking a model; validates every answer before believing it."""

    name = NAME

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "not-needed",
        timeout: float = 60.0,
        max_retries: int = 2,
        temperature: float = 0.0,
        max_tokens: int | None = 1024,
        dialect: DialectChoice = "auto",
        max_replicas: int = 20,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_replicas = max_replicas
        self.dialects = Dialects(dialect)
        self.last_attempts = 0  # answers the last decision took (1 or 2; 0 before any)
        self.max_retries = max_retries
        self._client = client or openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
        )

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> LLMReasoner:
        if not settings.llm_base_url or not settings.llm_model:
            raise ValueError("FLOTILLA_REASONER=llm needs FLOTILLA_LLM_BASE_URL and FLOTILLA_LLM_MODEL")
        return cls(
            base_url=settings.llm_base_url,
            model=settings.llm_model,
            api_key=settings.llm_api_key.get_secret_value(),
            timeout=settings.llm_timeout_seconds,
            max_retries=settings.llm_max_retries,
            temperature=settings.llm_temperature,
            max_tokens=settings.llm_max_tokens,
            dialect=settings.llm_response_format,
            max_replicas=settings.max_replicas,
        )

    # ------------------------------------------------------------- decisions

    def diagnose(self, evidence: DiagnosticEvidence) -> Diagnosis:
        return self._decide(
            DIAGNOSE_SYSTEM,
            diagnosis_facts(evidence),
            ("flotilla_diagnosis", DIAGNOSIS_SCHEMA),
            lambda text, model, usage: diagnosis_from_answer(text, evidence, reasoner=NAME, model=model, usage=usage),
        )

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Proposal:
        if diagnosis.verdict is Verdict.NEEDS_EVIDENCE:
            raise ValueError("a request for more evidence is not a diagnosis to plan for")
        return self._decide(
            PROPOSE_SYSTEM,
            proposal_facts(diagnosis, topology, self.max_replicas),
            ("flotilla_recovery_plan", PROPOSAL_SCHEMA),
            lambda text, model, usage: proposal_from_answer(
                text, diagnosis, topology, reasoner=NAME, model=model, usage=usage, max_replicas=self.max_replicas
            ),
        )

    # ----------------------------------------------------------- the exchange

    def _decide(
        self,
        system: str,
        facts: dict[str, Any],
        schema: tuple[str, dict[str, Any]],
        parse: Callable[[str | None, str | None, TokenUsage], T],
    ) -> T:
        # The system message is a constant; the facts are data, cleaned and escaped
        # (flotilla_reasoning.prompt): nothing they say can become an instruction.
        messages = conversation(system, facts)
        usage = TokenUsage()
        problems: list[str] = []
        text: str | None = None
        for attempt in range(1, ATTEMPTS + 1):
            self.last_attempts = attempt
            try:
                completion = self._complete(messages, schema)
            except openai.OpenAIError as exc:
                raise ReasoningFailed(
                    f"the model server did not answer: {exc.__class__.__name__}",
                    reasoner=NAME,
                    usage=usage,
                    attempts=attempt,
                    problems=[str(exc)[:500]],
                ) from exc
            if completion.usage is not None:
                usage += TokenUsage(completion.usage.prompt_tokens, completion.usage.completion_tokens)
                LLM_TOKENS.labels(self.model, "prompt").inc(completion.usage.prompt_tokens)
                LLM_TOKENS.labels(self.model, "completion").inc(completion.usage.completion_tokens)
            choice = completion.choices[0] if completion.choices else None
            text = choice.message.content if choice is not None else None
            try:
                if choice is None:
                    raise InvalidDecision(["the response has no choices"])
                if choice.message.refusal:
                    raise InvalidDecision([f"the model refused: {choice.message.refusal[:200]}"])
                if choice.finish_reason == "length":
                    raise InvalidDecision(["the answer was cut off at the token limit; answer more briefly"])
                return parse(text, completion.model or self.model, usage)
            except InvalidDecision as exc:
                problems = exc.problems
                log.warning("%s answer %d rejected: %s", NAME, attempt, "; ".join(problems))
            messages += [
                {"role": "assistant", "content": text or ""},
                {"role": "user", "content": rejection(problems)},
            ]
        raise ReasoningFailed(
            f"the model's answer was rejected {ATTEMPTS} times ({len(problems)} problem(s) in the last)",
            reasoner=NAME,
            usage=usage,
            attempts=ATTEMPTS,
            problems=problems,
            last_answer=text,
        )

    def _complete(
        self, messages: list[ChatCompletionMessageParam], schema: tuple[str, dict[str, Any]]
    ) -> ChatCompletion:
        """One chat completion, asking for ``schema`` in the server's dialect. Until a server
        has answered once, a request it refuses for its response format is asked again in the
        next dialect (:class:`Dialects`); after that, an error is the server's answer."""
        name, body = schema
        while True:
            dialect = self.dialects.current
            try:
                completion = self._ask(self._request(messages, dialect, name, body), dialect)
            except openai.APIStatusError as exc:
                if self.dialects.settled or not format_refused(exc) or not self.dialects.fall_back(exc):
                    raise
                continue
            self.dialects.settle()
            return completion

    def _request(
        self, messages: list[ChatCompletionMessageParam], dialect: Dialect, name: str, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """The create() arguments of one request in ``dialect``."""
        if dialect == "json_object":  # nothing constrains the answer: the schema goes in the prompt
            messages = [{"role": "system", "content": with_schema(str(messages[0]["content"]), schema)}, *messages[1:]]
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "response_format": response_format(dialect, name, schema),
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        return request

    def _ask(self, request: dict[str, Any], dialect: Dialect) -> ChatCompletion:
        """Send one request. A body that is not a chat completion (cut off on the way, a
        proxy's HTML error page) is asked again as often as the client retries a failed
        call, then raised as :class:`UnreadableAnswer`: the SDK itself retries neither."""
        span = {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model, "flotilla.llm.dialect": dialect}
        problem = ""
        for attempt in range(self.max_retries + 1):
            with tracing.child_span("chat", span):
                try:
                    answer: object = self._client.chat.completions.create(**request)
                except ValueError as exc:  # the SDK's json.loads of a body cut off mid-way
                    problem = f"a body that is not JSON ({exc})"
                else:
                    if isinstance(answer, ChatCompletion):
                        return answer
                    problem = f"a body that is not a chat completion: {str(answer)[:120]!r}"
            log.warning("the model server answered %s (try %d of %d)", problem, attempt + 1, self.max_retries + 1)
        raise UnreadableAnswer(f"the model server answered {problem}")


class UnreadableAnswer(openai.OpenAIError):
    """The server's answer could not be read as a chat completion, however often it was asked."""


class Dialects:
    """Which response-format dialect this reasoner sends: the configured one, or (``auto``) the
    first of :data:`~flotilla_reasoning.dialects.AUTO_ORDER` the server accepts. The choice is
    settled by the first answer and kept for the process's life."""

    def __init__(self, choice: DialectChoice) -> None:
        self._order: list[Dialect] = list(AUTO_ORDER) if choice == "auto" else [choice]
        self._index = 0
        self.settled = choice != "auto"

    @property
    def current(self) -> Dialect:
        return self._order[self._index]

    def fall_back(self, refusal: openai.APIStatusError) -> bool:
        """Move to the next dialect after ``refusal``; False when none is left."""
        if self._index + 1 >= len(self._order):
            return False
        log.warning(
            "the model server refused response_format %s (HTTP %s): trying %s",
            self.current,
            refusal.status_code,
            self._order[self._index + 1],
        )
        self._index += 1
        return True

    def settle(self) -> None:
        if not self.settled:
            self.settled = True
            LLM_DIALECT.labels(self.current).set(1)
            log.info("the model server accepts response_format %s: using it", self.current)
