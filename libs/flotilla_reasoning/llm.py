"""The LLM reasoner: any OpenAI-compatible chat-completions server, structured output.

Each decision is one conversation: a system message with the rules of the game, a user
message with the evidence as JSON, and ``response_format`` set to the decision's JSON
Schema in the form the server speaks (:mod:`flotilla_reasoning.dialects`). The answer is
parsed and validated (:mod:`flotilla_reasoning.decision`); a bad
answer gets exactly one more chance, with the problems appended to the conversation,
and a second bad answer raises :class:`ReasoningFailed` — the agent escalates and the
answer never becomes a record. Tokens are summed over both attempts.
"""

from __future__ import annotations

import json
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

DIAGNOSE_SYSTEM = """\
You are the diagnostic agent of an incident-response system. A service is slow. From the \
topology and latency evidence you are given, decide why, and answer with one JSON object \
that matches the response schema exactly — no other text, no extra fields.
- verdict "dependency-failure": one of the service's own dependencies is failing; name it in \
suspectedDependency and say how in failureMode (e.g. slow-responses, timeouts, error-rate).
- verdict "concluded": another cause; set causeCategory (capacity, bad-deployment, \
configuration, external or unknown).
- verdict "needs-evidence": only when needsEvidenceAllowed is true and the evidence cannot \
decide; set jobKind (e.g. cpu-profile, dependency-probe). A slow job then gathers more.
"Normal" latency of a dependency is its baselineP95Ms where given (learned while the caller \
was healthy); poolUtilization above 1 means requests queue for the service's worker pool.
Fields that do not apply to your verdict are null. incidentId and service are copied exactly. \
confidence is between 0 and 1. evidence lists the observations you rely on, most important first.\
"""

PROPOSE_SYSTEM = """\
You are the remediation agent of an incident-response system. From a diagnosis and the \
topology, propose a recovery plan of one to five steps, run in order; answer with one JSON \
object that matches the response schema exactly — no other text, no extra fields.
Actions: scale (replicas: the absolute count), restart (rolling: true or false), rollback \
(toRevision), failover (dependency and toTarget, one of the service's failoverTargets). Each \
step names a service of the topology and its environment; parameters that do not apply to \
the step's action are null. incidentId and diagnosisEventId are copied exactly. Your plan is \
a proposal: a policy and possibly a person decide whether it runs.\
"""


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
        facts = {
            "incidentId": evidence.incident_id,
            "service": evidence.service,
            "environment": evidence.environment,
            "symptom": evidence.symptom,
            "needsEvidenceAllowed": evidence.may_request_more,
            "diagnosticJob": None
            if evidence.job_id is None
            else {"jobId": evidence.job_id, "jobKind": evidence.job_kind, "status": "finished"},
            "topology": evidence.topology.to_json(),
        }
        return self._decide(
            DIAGNOSE_SYSTEM,
            facts,
            ("flotilla_diagnosis", DIAGNOSIS_SCHEMA),
            lambda text, model, usage: diagnosis_from_answer(text, evidence, reasoner=NAME, model=model, usage=usage),
        )

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Proposal:
        facts = {
            "incidentId": diagnosis.incident_id,
            "diagnosisEventId": diagnosis.event_id,
            "maxReplicas": self.max_replicas,
            "diagnosis": {
                "verdict": diagnosis.verdict.value,
                "service": diagnosis.service,
                "suspectedDependency": diagnosis.suspected_dependency,
                "failureMode": diagnosis.failure_mode,
                "causeCategory": diagnosis.cause_category,
                "summary": diagnosis.reasoning.summary,
                "confidence": diagnosis.reasoning.confidence,
                "evidence": [e.to_record().to_value() for e in diagnosis.reasoning.evidence],
            },
            "topology": topology.to_json(),
        }
        if diagnosis.verdict is Verdict.NEEDS_EVIDENCE:
            raise ValueError("a request for more evidence is not a diagnosis to plan for")
        return self._decide(
            PROPOSE_SYSTEM,
            facts,
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
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            # Compact: every blank is a token the incident pays for (an estate's topology
            # with its history runs to thousands), and models read it as well.
            {"role": "user", "content": json.dumps(facts, separators=(",", ":"), default=str)},
        ]
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
                {
                    "role": "user",
                    "content": "Your answer was rejected by validation:\n- "
                    + "\n- ".join(problems)
                    + "\nAnswer again with one JSON object that matches the response schema exactly.",
                },
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
            first = messages[0]
            messages = [
                {"role": "system", "content": f"{first['content']}\nThe response schema:\n{json.dumps(schema)}"},
                *messages[1:],
            ]
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
