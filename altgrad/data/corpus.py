"""A deterministic corpus of legal-register text, generated offline from a grammar written for this project.

The documents imitate the shape of EU legislative acts — title, citations, recitals, chapters, articles with numbered
paragraphs and points, definitions, cross-references, dates and amounts — so that a small model has real structure to
learn (repeated formulae, numbering, quoting, defined terms reused later) without any download. The same seed always
gives the same text; `CORPUS_VERSION` changes whenever the grammar does, so token caches keyed on it stay valid.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator

CORPUS_VERSION = 1

MONTHS = (
    "January February March April May June July August September October November December"
).split()
ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split()
NUMBER_WORDS = "two three four five six seven eight nine ten twelve eighteen twenty-four thirty-six".split()

# Grammar: each symbol expands to one of its alternatives; `{symbol}` inside an alternative is expanded recursively.
GRAMMAR: dict[str, list[str]] = {
    "subject": [
        "the protection of natural persons with regard to the processing of {data_kind} and on the free movement "
        "of such data",
        "the approval and market surveillance of {product} and of systems intended for such {product}",
        "the common organisation of the markets in {agri} and on specific provisions for certain {agri}",
        "the prudential requirements for {institution} and on the supervision of {institution}",
        "the establishment of a framework for the {policy_goal} and on the reporting of {report_item}",
        "the conditions for access to the market for {service} and on the rights of {beneficiary}",
        "the prevention of the use of the financial system for the purposes of {crime}",
        "the interoperability of {system} in the field of {field}",
        "harmonised rules on {technology} and on the liability of {operator}",
        "the safety of {product} placed on the Union market",
    ],
    "data_kind": ["personal data", "health data", "traffic data", "biometric data", "financial data"],
    "product": [
        "motor vehicles", "medical devices", "toys", "construction products", "machinery products",
        "radio equipment", "batteries and waste batteries", "pressure equipment", "cosmetic products",
    ],
    "agri": ["agricultural products", "wine products", "dairy products", "fishery products", "fruit and vegetables"],
    "institution": ["credit institutions", "investment firms", "insurance undertakings", "central counterparties"],
    "policy_goal": [
        "achievement of climate neutrality", "reduction of greenhouse gas emissions", "conservation of biodiversity",
        "improvement of energy efficiency", "promotion of the use of energy from renewable sources",
    ],
    "report_item": ["emissions", "energy consumption", "public procurement", "state aid", "serious incidents"],
    "service": ["port services", "air transport services", "payment services", "postal services", "rail services"],
    "beneficiary": [
        "passengers", "consumers", "workers", "persons with disabilities", "small and medium-sized enterprises",
    ],
    "crime": [
        "money laundering or terrorist financing", "tax evasion",
        "fraud affecting the financial interests of the Union",
    ],
    "system": ["EU information systems", "electronic health records", "tachographs", "electronic identification means"],
    "field": ["borders and visa", "police and judicial cooperation", "asylum and migration", "road transport"],
    "technology": ["artificial intelligence", "digital services", "electronic signatures", "crypto-assets"],
    "operator": ["providers", "deployers", "intermediaries", "issuers", "platform operators"],
    "actor": [
        "Member States", "the Commission", "the competent authorities", "the Agency", "the Board",
        "the national supervisory authority", "each Member State", "the notified body", "the market surveillance "
        "authorities", "the manufacturer", "the importer", "the distributor", "the operator", "the provider",
        "the applicant", "the holder of the authorisation", "the controller", "the processor",
    ],
    "actor_plural": [
        "Member States", "competent authorities", "operators", "manufacturers", "importers", "distributors",
        "providers", "credit institutions", "notified bodies", "market surveillance authorities",
    ],
    "shall_verb": [
        "shall ensure that {clause}", "shall take the necessary measures to {action}", "shall {action}",
        "shall, without undue delay, {action}", "shall be responsible for {gerund}", "may {action}",
        "shall not {action} unless {clause}", "shall notify {actor} of {object}",
        "shall lay down the rules on {object} and shall take all measures necessary to ensure that they are "
        "implemented",
    ],
    "action": [
        "adopt {object}", "establish {object}", "keep {object} up to date", "make {object} publicly available",
        "inform {actor} of {object}", "carry out {assessment}", "cooperate with {actor}",
        "submit {a_report} to {actor}", "designate one or more {authority}", "verify that {clause}",
        "take appropriate corrective action", "publish {object} on its website",
    ],
    "gerund": [
        "monitoring the application of this {act}", "maintaining {object}", "verifying {object}",
        "coordinating the activities of {actor_plural}", "assessing the conformity of {product}",
    ],
    "clause": [
        "{actor_plural} comply with the requirements laid down in {ref}",
        "the information referred to in {ref} is provided free of charge",
        "{object} is kept for a period of {number_word} years",
        "{actor} has been informed {timing}",
        "the conditions set out in {ref} are fulfilled",
        "{object} is accessible to {beneficiary}",
        "{actor_plural} have access to {object}",
        "the measures taken are effective, proportionate and dissuasive",
        "any {term} is processed in accordance with {external_ref}",
    ],
    "object": [
        "the technical documentation", "a register of {term_plural}", "the list referred to in {ref}",
        "the information referred to in {ref}", "the measures referred to in paragraph {par}",
        "a risk management system", "the results of {assessment}", "detailed rules for the application of {ref}",
        "the name and contact details of the {term}", "a summary of the {report}", "the relevant records",
        "the declaration of conformity", "an annual work programme", "any serious incident",
        "the penalties applicable to infringements of this {act}",
    ],
    "assessment": [
        "a conformity assessment", "an impact assessment", "a risk assessment", "an evaluation of this {act}",
        "the checks referred to in {ref}", "an audit of {object}",
    ],
    "report": ["report", "annual report", "progress report", "evaluation report", "implementation report"],
    "authority": ["competent authorities", "contact points", "supervisory authorities", "notified bodies"],
    "timing": [
        "without undue delay", "within {number_word} months of {event}", "by {date}", "at least once a year",
        "no later than {number_word} working days after {event}", "before {event}",
    ],
    "event": [
        "the date of entry into force of this {act}", "the receipt of the request", "the adoption of the decision",
        "the notification referred to in {ref}", "the end of each calendar year", "becoming aware of the incident",
    ],
    "provision": [
        "{actor} {shall_verb} {timing}.",
        "{actor} {shall_verb}.",
        "Without prejudice to {ref}, {actor_lc} {shall_verb}.",
        "Where {clause}, {actor_lc} {shall_verb}.",
        "For the purposes of paragraph {par}, {actor_lc} {shall_verb}.",
        "The Commission shall adopt implementing acts laying down {object}. Those implementing acts shall be "
        "adopted in accordance with the examination procedure referred to in {ref}.",
        "The Commission is empowered to adopt delegated acts in accordance with Article {art} to amend {annex} "
        "by {gerund}.",
        "By {date}, {actor_lc} shall submit {a_report} to the European Parliament and to the Council on {object}.",
        "Infringements of {ref} shall be subject to administrative fines of up to {amount} or, in the case of an "
        "undertaking, up to {percent} of the total worldwide annual turnover of the preceding financial year, "
        "whichever is higher.",
        "The amount referred to in {ref} shall be {amount} for the period {period}.",
        "{actor} shall include the following information in {object}:{points}",
        "The {term} shall be valid for a period of {number_word} years and may be renewed {timing}.",
        "{actor} shall, on request, provide {actor_lc2} with {object}.",
    ],
    "actor_lc": ["the Commission", "the competent authority", "Member States", "the operator", "the Agency"],
    "actor_lc2": ["the Commission", "the competent authorities", "the market surveillance authorities"],
    "a_report": ["a report", "an evaluation report", "an implementation report"],
    "definition": [
        "'{term}' means {a_thing} that {rel_clause};",
        "'{term}' means any {thing} {purpose};",
        "'{term}' means a natural or legal person who {rel_clause};",
        "'{term}' means {a_thing} as defined in {external_ref};",
    ],
    "a_thing": ["a body", "a system", "an entity", "a product", "a service", "a measure", "an operation"],
    "thing": ["information", "operation", "measure", "document", "action", "procedure"],
    "rel_clause": [
        "is established in the Union", "places {product} on the Union market", "carries out {assessment}",
        "is designated in accordance with {ref}", "is responsible for {gerund}", "makes {product} available on the "
        "market in the course of a commercial activity",
    ],
    "purpose": [
        "intended to {action}", "carried out for the purpose of {gerund}", "which is necessary to {action}",
        "taken in accordance with {ref}",
    ],
    "recital": [
        "{external_act} lays down rules on {subject}. In the interest of clarity, that {act_lc} should be replaced.",
        "In order to ensure {goal}, it is necessary to lay down {object_lc}.",
        "{actor} should {action}. This should be without prejudice to {ref}.",
        "Since the objective of this {act}, namely {goal}, cannot be sufficiently achieved by the Member States, "
        "the Union may adopt measures, in accordance with the principle of subsidiarity as set out in Article 5 of "
        "the Treaty on European Union.",
        "In order to ensure uniform conditions for the implementation of this {act}, implementing powers should be "
        "conferred on the Commission. Those powers should be exercised in accordance with Regulation (EU) No "
        "182/2011 of the European Parliament and of the Council.",
        "The Commission should carry out {assessment} by {date} and should report on its main findings.",
        "It is appropriate to provide for a transitional period of {number_word} months in order to allow "
        "{actor_plural} to adapt to the new requirements.",
        "The European Data Protection Supervisor was consulted in accordance with Article 42(1) of Regulation (EU) "
        "2018/1725 and delivered an opinion on {date}.",
    ],
    "goal": [
        "a high level of protection of {beneficiary}", "the proper functioning of the internal market",
        "legal certainty for {actor_plural}", "the {policy_goal}", "a level playing field for {actor_plural}",
    ],
    "object_lc": [
        "common rules on {object_kind}", "minimum requirements for {object_kind}", "a procedure for {gerund}",
    ],
    "object_kind": ["{product}", "{service}", "the {report}", "{data_kind}", "the supervision of {institution}"],
    "chapter_title": [
        "GENERAL PROVISIONS", "OBLIGATIONS OF {actor_plural_uc}", "SUPERVISION AND ENFORCEMENT", "PENALTIES",
        "COOPERATION BETWEEN AUTHORITIES", "DELEGATED AND IMPLEMENTING ACTS", "TRANSITIONAL AND FINAL PROVISIONS",
        "REQUIREMENTS FOR {product_uc}", "MARKET SURVEILLANCE",
    ],
    "actor_plural_uc": ["OPERATORS", "MANUFACTURERS", "PROVIDERS", "MEMBER STATES", "NOTIFIED BODIES"],
    "product_uc": ["PRODUCTS", "SERVICES", "SYSTEMS", "INSTALLATIONS"],
    "article_title": [
        "Subject matter", "Scope", "Obligations of {actor_plural}", "Penalties", "Exercise of the delegation",
        "Committee procedure", "Reporting", "Evaluation and review", "Cooperation with {actor_plural}",
        "Confidentiality", "Register of {term_plural}", "Notification of {term_plural}", "Transitional provisions",
        "Requirements for {product}", "Access to {object_short}", "Designation of {authority}",
    ],
    "object_short": ["information", "documents", "the register", "data", "justice"],
    "annex": ["Annex I", "Annex II", "Annex III", "Annex IV", "the Annexes"],
    "act": ["Regulation"],
    "act_lc": ["Regulation", "Directive", "Decision"],
    "external_act": [
        "Regulation (EU) {year}/{act_no} of the European Parliament and of the Council",
        "Council Directive {year}/{act_no}/EC", "Directive {year}/{act_no}/EU of the European Parliament and of "
        "the Council", "Commission Decision {year}/{act_no}/EU",
    ],
    "external_ref": ["{external_act}", "Article {small} of {external_act}", "{annex} to {external_act}"],
}
TERMS = [
    "competent authority", "operator", "manufacturer", "importer", "distributor", "provider", "placing on the market",
    "making available on the market", "serious incident", "authorised representative", "notified body",
    "conformity assessment", "recall", "withdrawal", "technical specification", "harmonised standard",
    "supervisory authority", "controller", "processor", "consent", "personal data breach", "main establishment",
    "cross-border processing", "payment account", "electronic money", "crypto-asset", "trading venue", "deployer",
]
COUNTABLE_TERMS = frozenset([
    "competent authority", "operator", "manufacturer", "importer", "distributor", "provider", "serious incident",
    "authorised representative", "notified body", "technical specification", "harmonised standard",
    "supervisory authority", "controller", "processor", "payment account", "crypto-asset", "trading venue",
    "deployer",
])


class _Expander:
    """Expands grammar symbols with a seeded random generator and per-document state (act type, article count)."""

    _SYMBOL = re.compile(r"\{(\w+)\}")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.act = "Regulation"
        self.n_articles = 10
        self.terms: list[str] = TERMS[:4]
        self.special: dict[str, Callable[[], str]] = {
            "date": self.date,
            "year": lambda: str(rng.randint(1990, 2024)),
            "act_no": lambda: str(rng.randint(1, 2400)),
            "number_word": lambda: rng.choice(NUMBER_WORDS),
            "amount": self.amount,
            "percent": lambda: f"{rng.choice([1, 2, 3, 4, 6, 7, 10])} %",
            "ref": self.ref,
            "art": lambda: str(rng.randint(1, self.n_articles)),
            "small": lambda: str(rng.randint(1, 60)),
            "par": lambda: str(rng.randint(1, 4)),
            "term": lambda: rng.choice(self.terms),
            "term_plural": self.term_plural,
            "period": self.period,
            "points": self.points,
            "act": lambda: self.act,
        }

    def expand(self, symbol: str) -> str:
        fn = self.special.get(symbol)
        if fn is not None:
            return fn()
        return self.fill(self.rng.choice(GRAMMAR[symbol]))

    def fill(self, template: str) -> str:
        return self._SYMBOL.sub(lambda m: self.expand(m.group(1)), template)

    def date(self) -> str:
        return f"{self.rng.randint(1, 28)} {self.rng.choice(MONTHS)} {self.rng.randint(2000, 2031)}"

    def period(self) -> str:
        start, end = sorted((self.rng.randint(2000, 2031), self.rng.randint(2000, 2031)))
        return f"from 1 {self.rng.choice(MONTHS)} {start} to 31 December {end + 1}"

    def term_plural(self) -> str:
        nouns = [t for t in self.terms if t in COUNTABLE_TERMS] or list(COUNTABLE_TERMS)
        noun = self.rng.choice(nouns)
        return noun[:-1] + "ies" if noun.endswith(("ty", "dy")) else noun + "s"

    def points(self) -> str:
        """A list of lettered points closing a provision that ends in a colon."""
        items = [f"({'abcdefgh'[j]}) {self.expand('object')};" for j in range(self.rng.randint(2, 5))]
        items[-2] += " and"
        items[-1] = items[-1][:-1] + "."
        return "\n" + "\n".join(items)

    def amount(self) -> str:
        # EU legal texts group thousands with spaces: EUR 1 500 000.
        value = self.rng.choice([5, 10, 15, 20, 35, 50, 75, 100, 250, 500]) * 10 ** self.rng.randint(3, 6)
        if value >= 10**6 and self.rng.random() < 0.4:
            return f"EUR {value // 10**6} million"
        return "EUR " + f"{value:,}".replace(",", " ")

    def ref(self) -> str:
        art = self.rng.randint(1, self.n_articles)
        kind = self.rng.random()
        if kind < 0.4:
            return f"Article {art}"
        if kind < 0.7:
            return f"Article {art}({self.rng.randint(1, 4)})"
        if kind < 0.85:
            return f"point ({'abcdef'[self.rng.randint(0, 5)]}) of Article {art}({self.rng.randint(1, 3)})"
        return f"the second subparagraph of Article {art}({self.rng.randint(1, 3)})"


def _article(ex: _Expander, number: int, title: str, body: list[str]) -> str:
    return f"Article {number}\n{title}\n" + "\n".join(body)


def _paragraphs(ex: _Expander) -> list[str]:
    rng = ex.rng
    if rng.random() < 0.25:
        return [_sentence(ex.expand("provision"))]
    out = []
    for i in range(1, rng.randint(2, 5) + 1):
        out.append(f"{i}. {_sentence(ex.expand('provision'))}")
    return out


def generate_document(rng: random.Random) -> str:
    """One legislative act: title, citations, recitals, chapters of articles, final provisions, signatures."""
    ex = _Expander(rng)
    ex.act = rng.choice(["Regulation", "Regulation", "Directive", "Decision"])
    ex.n_articles = rng.randint(6, 18)
    ex.terms = rng.sample(TERMS, rng.randint(4, 9))
    act_uc = ex.act.upper()
    year = rng.randint(1995, 2024)
    suffix = {"Regulation": "", "Directive": "/EU", "Decision": "/EU"}[ex.act]
    lines = [
        f"{act_uc} (EU) {year}/{rng.randint(1, 2400)}{suffix} OF THE EUROPEAN PARLIAMENT AND OF THE COUNCIL",
        f"of {ex.date()}",
        f"on {ex.expand('subject')}" + (f" and amending {ex.expand('external_act')}" if rng.random() < 0.4 else ""),
        "(Text with EEA relevance)" if rng.random() < 0.6 else "",
        "THE EUROPEAN PARLIAMENT AND THE COUNCIL OF THE EUROPEAN UNION,",
        "Having regard to the Treaty on the Functioning of the European Union, and in particular Article "
        f"{rng.choice([43, 91, 100, 114, 168, 192, 207])}{rng.choice(['', '(1)', '(2)'])} thereof,",
        "Having regard to the proposal from the European Commission,",
        "After transmission of the draft legislative act to the national parliaments,",
        "Having regard to the opinion of the European Economic and Social Committee,",
        "Acting in accordance with the ordinary legislative procedure,",
        "Whereas:",
    ]
    lines += [f"({i}) {_sentence(ex.expand('recital'))}" for i in range(1, rng.randint(4, 14) + 1)]
    lines.append(f"HAVE ADOPTED THIS {act_uc}:")

    templates = rng.choices(GRAMMAR["definition"], k=len(ex.terms))
    definitions = [
        f"({i}) " + ex.fill(d.replace("'{term}'", f"'{t}'", 1)) for i, (d, t) in enumerate(zip(templates, ex.terms), 1)
    ]
    definitions[-1] = definitions[-1][:-1] + "."
    articles = [
        _article(ex, 1, "Subject matter", [f"This {ex.act} lays down rules on {ex.expand('subject')}."]),
        _article(ex, 2, "Definitions", [f"For the purposes of this {ex.act}, the following definitions apply:"]
                 + definitions),
    ]
    for number in range(3, ex.n_articles):
        articles.append(_article(ex, number, ex.expand("article_title"), _paragraphs(ex)))
    if ex.act == "Directive":
        final = [
            "1. Member States shall bring into force the laws, regulations and administrative provisions necessary "
            f"to comply with this Directive by {ex.date()}. They shall immediately inform the Commission thereof.",
            "2. Member States shall communicate to the Commission the text of the main measures of national law "
            "which they adopt in the field covered by this Directive.",
        ]
        articles.append(_article(ex, ex.n_articles, "Transposition", final))
    else:
        articles.append(_article(ex, ex.n_articles, "Entry into force and application", [
            f"This {ex.act} shall enter into force on the {rng.choice(['twentieth', 'third', 'first'])} day "
            "following that of its publication in the Official Journal of the European Union.",
            f"It shall apply from {ex.date()}.",
        ]))

    # Group the articles into chapters; the first chapter always holds subject matter and definitions.
    n_chapters = max(1, min(len(articles) // 3, rng.randint(2, 5)))
    cuts = sorted(rng.sample(range(2, len(articles)), n_chapters - 1)) if n_chapters > 1 else []
    body, start = [], 0
    for c, end in enumerate(cuts + [len(articles)]):
        title = "GENERAL PROVISIONS" if c == 0 else ex.expand("chapter_title")
        body.append(f"CHAPTER {_roman(c + 1)}\n{title}")
        body.extend(articles[start:end])
        start = end
    lines += body
    closing = (
        "This Directive is addressed to the Member States." if ex.act == "Directive" else
        f"This {ex.act} shall be binding in its entirety and directly applicable in all Member States."
    )
    lines += [closing, f"Done at {rng.choice(['Brussels', 'Strasbourg', 'Luxembourg'])}, {ex.date()}.",
              "For the European Parliament\nThe President", "For the Council\nThe President"]
    return "\n".join(line for line in lines if line) + "\n"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _roman(n: int) -> str:
    numerals = [(10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for value, letters in numerals:
        while n >= value:
            out += letters
            n -= value
    return out


def iter_documents(seed: int, min_chars: int) -> Iterator[str]:
    """Documents from the seeded grammar until at least min_chars characters have been produced."""
    rng = random.Random(seed)
    total = 0
    while total < min_chars:
        doc = generate_document(rng)
        total += len(doc)
        yield doc
