"""Prompt texts of the breaker loop (``agents.breaker``): what each role is asked, per taxonomy.

The LLM taxonomies follow the counter-intuitive instruction categories of Inverse IFEval:

* ``qc`` (question correction): the question itself is wrong (a false premise, an impossible or
  inconsistent condition); the right answer points the error out and corrects it instead of answering
  as asked;
* ``itf`` (intentional textual flaws): the instruction asks for text that deliberately breaks a habit of
  careful writing (misspellings, wrong punctuation, a given number of errors), and the answer must
  contain exactly those flaws;
* ``mim`` (mid-turn instruction modification): the instruction is changed part-way through the prompt;
  only the final instruction counts.

Every prompt asks for one JSON object, the form ``agents.breaker`` parses (with one retry on a parse
error). Placeholders are filled with ``str.format``.
"""

from __future__ import annotations

__all__ = [
    "OUTPUT_FORMAT", "CRITERIA_RULES", "PROMPT_HEADER", "TAXONOMY_PROMPTS", "REFINEMENT_TECHNIQUES",
    "REFINEMENT_PROMPT", "VALIDATOR_PROMPT", "JUDGE_PROMPT", "RETRY_PROMPT", "FLAW_GENERATOR_PROMPT",
    "FLAW_FEEDBACK_PROMPT",
]

OUTPUT_FORMAT = """\
Answer with exactly one JSON object and nothing else:
{{"taxonomy": "{taxonomy}", "prompt": "<the task given to the model under test>",
  "correct_response": "<an ideal answer to the prompt>",
  "response_reference": [{{"id": "C1", "criterion": "<one checkable requirement>"}}, ...]}}"""

CRITERIA_RULES = """\
Rules for the criteria (response_reference):
- 2 to 5 criteria, ids C1, C2, ... in order; each checks one observable property of an answer.
- Each criterion is decidable from the answer text alone, with no judgement of style or taste.
- Together they separate an answer that follows the prompt's real intent from one that follows habit.
- The correct_response satisfies every criterion."""

PROMPT_HEADER = """\
You design test tasks that reveal when a language model follows its habits instead of the instruction
in front of it. A task is a prompt for the model under test, an ideal answer, and criteria a grader
checks the answer against. The task must be solvable: a careful reader gets it right."""

TAXONOMY_PROMPTS = {
    "qc": """\
Taxonomy: question correction (qc).
Write a question that contains an error: a false premise, a wrong fact taken for granted, an impossible
or self-contradictory condition, or a calculation set up on a wrong value. A model that answers the
question as asked is wrong; the ideal answer notices the error, says what it is, corrects it and then
answers the corrected question where that makes sense. Make the error plausible and easy to overlook.""",
    "itf": """\
Taxonomy: intentional textual flaws (itf).
Write an instruction that asks for text containing specific, deliberate flaws: for example a given
number of misspelled words, sentences without final punctuation, a word repeated on purpose, lowercase
where capitals are usual. The flaws are the requirement: an answer with correct, polished text fails.
State the flaws precisely enough that a grader can count them.""",
    "mim": """\
Taxonomy: mid-turn instruction modification (mim).
Write a prompt that gives a clear first instruction, then, part-way through, changes it (a different
format, length, language, subject or constraint), possibly more than once. Only the final instruction
counts; an answer that follows an earlier one fails. Make the first instruction natural and the
change explicit but easy to skim past.""",
}

REFINEMENT_TECHNIQUES = {
    "qc": """\
- Hide the error deeper: embed it in a detail the question relies on rather than in its main clause.
- Add a plausible distractor that draws attention away from the error.
- Use a subtle inconsistency (two numbers, dates or names that cannot both hold), not a plain falsehood.""",
    "itf": """\
- Entangle the constraints: make the flaws interact (a misspelled word that must also be the last word).
- Use counts that are easy to get wrong (exactly three, not "some") and flaws a model tends to fix by habit.
- Keep the request looking simple, so the fragile part is easy to miss.""",
    "mim": """\
- Make the initial instruction strong and detailed, so following it feels natural.
- Make the modification explicit but place it where it is easy to skim past; consider a second modification.
- Make the final instruction clearly different from the first, so an answer reveals which one it followed.""",
}

REFINEMENT_PROMPT = """\
{header}

{taxonomy_prompt}

Your previous task did not break the model under test: {fail_count} of {attempts} answers failed; at
least {threshold} must fail. Refine the task so that the model fails while a careful reader still
succeeds.

Previous prompt:
{prompt}

Previous ideal answer:
{correct_response}

Check of that ideal answer against its criteria: {validator_status}. {validator_remarks}

Criteria and how many of the {attempts} answers failed each:
{criteria_report}

Criteria marked "needs improvement" were passed too often: change the prompt so that those
requirements become harder to meet by habit. Criteria marked "keep intact" already catch the model:
keep the parts of the prompt that make them work.

Techniques for this taxonomy:
{techniques}

An answer of the model under test, for reference:
{sample_answer}

Constraints:
- Keep the task logically consistent and solvable, and within its taxonomy.
- Do not make a criterion stricter on its own: a criterion changes only with the prompt it checks.
- The new correct_response must satisfy every new criterion.

{criteria_rules}

{output_format}"""

VALIDATOR_PROMPT = """\
You check a reference answer against its grading criteria before the task is used.

Prompt given to the model:
{prompt}

Reference answer:
{correct_response}

Criteria:
{criteria}

Decide whether the reference answer satisfies every criterion and whether the criteria agree with the
prompt. Answer with exactly one JSON object and nothing else:
{{"status": "PASS" or "FAIL", "remarks": "<which criteria hold or fail, and why>"}}"""

JUDGE_PROMPT = """\
You grade an answer against a list of criteria. Judge each criterion strictly and independently, from
the answer text alone.

Prompt given to the model:
{prompt}

Criteria:
{criteria}

Answer to grade:
{answer}

Answer with exactly one JSON object and nothing else:
{{"criteria": [{{"id": "C1", "status": "PASS" or "FAIL", "reason": "<short>"}}, ...],
  "status": "PASS" if every criterion passes, else "FAIL"}}"""

RETRY_PROMPT = ("Your answer could not be used: {error}. Reply again with exactly one JSON object as asked, "
                "and nothing else.")

FLAW_GENERATOR_PROMPT = """\
You design flawed workflow plans that make an executor fail. Each task below has a correct plan (a
numbered list of tool calls); you pick a task and a flaw to inject into its plan. The executor reads the
flawed plan in its prompt and plays the task in a simulator where tools fail at random; it is graded by
whether it reaches full success. A flaw counts only if it lowers the exact success of following the plan.

Flaw types (two injection methods each):
{flaw_types}

Severity in (0, 1] is the share of the eligible plan steps changed (at least one). Position (optional)
pins the first changed step (0-based); null lets the injector choose.

Candidate tasks:
{tasks}

Answer with exactly one JSON object and nothing else:
{{"task_id": "<one of the ids above>", "flaw_type": "<a flaw type>", "severity": <number in (0, 1]>,
  "position": <integer or null>}}"""

FLAW_FEEDBACK_PROMPT = """\
{base}

Your previous choice did not break the executor: task {task_id}, flaw {flaw_type} ({method}), severity
{severity}, position {position}. {fail_count} of {attempts} episodes failed; at least {threshold} must fail.
Exact success of following the plan: {success_flawed} with the flaw, {success_reference} without it.
Episode levels: {levels}.
Suggested change: {suggestion}
Keep the task ({task_id}) and choose a stronger flaw."""
